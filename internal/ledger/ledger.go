// Package ledger is roched's state: every sandbox the daemon tracks and whose it is, the
// state file that a restarted daemon reads to keep serving them, the warm pools, the
// reaper, reconciliation with the providers, crash recovery, engine events and engine
// health, leases and admission. It knows tenants by name and limits only; it speaks no
// RPC. The API edge (internal/daemon) authenticates each call, turns it into a call
// here, and turns the answer into the wire's messages (internal/wire).
//
// The API the edge calls, all safe for concurrent use:
//
//	New, Start, Close                         the ledger's life
//	Create, Exec, Destroy, List, Inspect,     a tenant's sandboxes
//	Pause, Reset, Resolve
//	Hold, Live                                leased sandboxes (lease.go)
//	Commands, StartCommand                    durable commands (command.go)
//	Workspaces, RemoveWorkspace,              what outlives a sandbox (persist.go)
//	Snapshots, RemoveSnapshot
//	Pools, SelectPools, VerifyIdleSoon        the warm pools
//	Providers, Provider, Engines, Counts,     what /healthz and /metrics report
//	Serving, Owner, OwnerOf, Records, Tracked
//	Audit                                     the audit trail's one format
//
// It imports no connect, cobra, client or generated API package; imports_test.go
// fails if it does.
package ledger

import (
	"go.opentelemetry.io/otel/trace"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/pool"
)

// Config is what the ledger keeps and how.
type Config struct {
	// DefaultProvider serves the calls that name no provider, when it is served
	// (roched: internal/catalog.Default); otherwise the only provider served does.
	DefaultProvider string
	// StateFile keeps the sandboxes across restarts. Required: the edge puts it beside
	// its socket (defaults.StateFile) when the operator names none.
	StateFile string
	// MaxSandboxes bounds the sandboxes handed to clients at once (0: no bound). Idle
	// pooled sandboxes are bounded by their pools instead.
	MaxSandboxes int
	// MaxCommands bounds the durable commands running at once in one sandbox (0:
	// roche.MaxRunningCommands, the most).
	MaxCommands int
	// AllowRootSandboxes lets creates run commands as root (uid or gid 0, or a user
	// name, which the image may map to 0). Off, such creates are refused.
	AllowRootSandboxes bool
	// Pools are the warm pools.
	Pools []pool.Spec
	// PoolConcurrency fixes how many sandboxes all pools together create at once; 0
	// lets it adapt, from the machine's cores up (pool.WithConcurrency).
	PoolConcurrency int
	// ReapInterval is how often expired sandboxes are looked for (default 1 s).
	ReapInterval time.Duration
	// ReconcileInterval is how often the ledger compares its state with the providers'
	// (default 30 s), forgetting sandboxes removed behind its back.
	ReconcileInterval time.Duration
	// EngineCheckInterval is how often each provider's engine is asked whether it answers
	// (default 2 s; health.go).
	EngineCheckInterval time.Duration
	// DirectOwner is the owner the direct-mode CLI of roched's own user gives its
	// sandboxes (roche.Config.Owner: cli:USER@HOST, or that user's ROCHE_OWNER). Those
	// are served to that user (Tenant.Direct) as its own (direct.go); empty serves none.
	DirectOwner string
	// EndedRetention is how long why a sandbox ended is remembered for Inspect (0:
	// roche.DefaultEndedRetention); at most roche.MaxEndedKept ends are kept at once.
	EndedRetention time.Duration
	// ProviderOf names the provider that owns a sandbox id (internal/catalog.OfID), so
	// that an id the ledger does not track is asked of that provider alone; nil asks each.
	ProviderOf func(id string) string
	// Group, when set, makes this roched one of a replica group of that name: every
	// replica serves every sandbox of the group, and the elected leader alone reaps
	// them (group.go). Only providers that share their sandboxes may be served.
	Group string
	// Identity names this replica in the group's election (default: the host name and
	// the state file's instance).
	Identity string
	// LeaderLease is how long the group's leader holds its lease unrenewed (0: the
	// provider's default): a leader killed outright is replaced within it.
	LeaderLease time.Duration
}

// Validate reports every problem with the settings at once, for a ledger over the named
// providers.
func (c Config) Validate(providers []string) error {
	limits, pools := c.Problems(providers)
	return errors.Join(append(limits, pools...)...)
}

// Problems is Validate as lists, in two parts (the bound on sandboxes, then the pools),
// so that the edge can report its own problems between them, as roched always has.
func (c Config) Problems(providers []string) (limits, pools []error) {
	if c.MaxSandboxes < 0 {
		limits = append(limits, fmt.Errorf("%w: max sandboxes %d is negative: give 0 (no limit) or more", roche.ErrInvalidConfig, c.MaxSandboxes))
	}
	if c.EndedRetention < 0 {
		limits = append(limits, fmt.Errorf("%w: ended retention %s is negative: give 0 (the default, %s) or more", roche.ErrInvalidConfig, c.EndedRetention, roche.DefaultEndedRetention))
	}
	if c.MaxCommands < 0 || c.MaxCommands > roche.MaxRunningCommands {
		limits = append(limits, fmt.Errorf("%w: max commands %d is outside 1 to %d (0: %d) per sandbox",
			roche.ErrInvalidConfig, c.MaxCommands, roche.MaxRunningCommands, roche.MaxRunningCommands))
	}
	providers = slices.Clone(providers)
	sort.Strings(providers)
	for _, s := range c.Pools {
		if !slices.Contains(providers, s.Provider) {
			pools = append(pools, fmt.Errorf("%w: pool %s: unknown provider %q: this daemon serves %s",
				roche.ErrInvalidConfig, s.Key, s.Provider, strings.Join(providers, ", ")))
		}
	}
	return limits, pools
}

// Observer hears what the ledger measures, for the edge's metrics. The default hears
// nothing.
type Observer interface {
	// Created: a create was served, from a pool ("pool") or made for it ("cold").
	Created(source string, took time.Duration)
	// Executed: a command ran, from request to result.
	Executed(took time.Duration)
	// Rejected: a create was refused at a bound on sandboxes.
	Rejected()
}

type noObserver struct{}

func (noObserver) Created(string, time.Duration) {}
func (noObserver) Executed(time.Duration)        {}
func (noObserver) Rejected()                     {}

// Option configures a Ledger.
type Option func(*Ledger)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(lg *Ledger) { lg.log = l } }

// WithPoolOptions passes options to the pool manager (tests shorten its janitor).
func WithPoolOptions(opts ...pool.Option) Option {
	return func(l *Ledger) { l.poolOpts = append(l.poolOpts, opts...) }
}

// WithObserver sets what hears the ledger's measurements.
func WithObserver(o Observer) Option { return func(l *Ledger) { l.obs = o } }

// AuditEntry is one line of the audit trail, as Audit logs it, for a sink that keeps
// them (the console's audit view).
type AuditEntry struct {
	Time   time.Time      `json:"time"`
	Tenant string         `json:"tenant"`
	Op     string         `json:"op"`
	OK     bool           `json:"ok"`
	Err    string         `json:"err,omitempty"`
	Attrs  map[string]any `json:"attrs,omitempty"`
}

// WithAuditSink passes every audit line to sink as well as to the log.
func WithAuditSink(sink func(AuditEntry)) Option { return func(l *Ledger) { l.auditSink = sink } }

// Ledger is the state of one roched.
type Ledger struct {
	cfg       Config
	auditSink func(AuditEntry)
	providers map[string]roche.Provider
	names     []string // provider names, sorted
	log       *slog.Logger
	obs       Observer
	tracer    trace.Tracer // nil: tracing off (trace.go)
	poolOpts  []pool.Option
	pools     *pool.Manager
	store     *store

	mu        sync.Mutex
	sandboxes map[string]*Record
	reserved  int // cold creates admitted and in flight
	// reservedBy counts them per tenant.
	reservedBy map[string]int
	seq        uint64
	// verifying: a check of the pools' idle sandboxes is pending (VerifyIdleSoon).
	verifying atomic.Bool
	// workdirs remembers, per pool and directory, whether a pooled sandbox can have
	// that workdir (see prepareWorkdir).
	workdirs map[string]bool
	// holds are the Hold counts of leased sandboxes (lease.go).
	holds map[string]*hold
	// ended remembers why client sandboxes ended behind the daemon's back (events.go).
	ended endings

	// listedAt is when each provider's sandboxes were last listed for a reconciliation
	// (sandboxesOf).
	listedAt map[string]time.Time

	// engines is whether each provider's engine answers (health.go).
	engines *engines

	removals sync.WaitGroup
	// removeSlots bounds concurrent removals so a burst of destroys cannot starve creates.
	removeSlots chan struct{}

	// recovered: the state file has been read and reconciled, so this ledger owns it
	// and may write it. A daemon that failed to start must not.
	recovered bool
	// unlockState releases the state file's lock (lockState).
	unlockState func()

	// instance and stateKey make up this daemon's owner (see owner.go).
	instance, stateKey string

	// elections: this replica's campaigns to lead its group (group.go); keys are the
	// idempotency keys of creates it served.
	elections *elections
	keysMu    sync.Mutex
	keys      map[string]*keyed

	stop   chan struct{}
	bg     sync.WaitGroup
	closed sync.Once
}

// New validates cfg and prepares a ledger over the providers; Start loads the state.
func New(cfg Config, providers map[string]roche.Provider, opts ...Option) (*Ledger, error) {
	if len(providers) == 0 {
		return nil, fmt.Errorf("%w: no providers to serve", roche.ErrInvalidConfig)
	}
	if cfg.StateFile == "" {
		return nil, fmt.Errorf("%w: no state file", roche.ErrInvalidConfig)
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = 30 * time.Second
	}
	if cfg.EngineCheckInterval <= 0 {
		cfg.EngineCheckInterval = 2 * time.Second
	}
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	sort.Strings(names)
	if err := cfg.Validate(names); err != nil {
		return nil, err
	}
	if err := checkGroup(cfg, providers); err != nil {
		return nil, err
	}
	if strings.HasPrefix(cfg.DirectOwner, ownerPrefix) {
		return nil, fmt.Errorf("%w: direct owner %q is a roched's: give the owner the direct-mode CLI uses (cli:USER@HOST, or its ROCHE_OWNER)", roche.ErrInvalidConfig, cfg.DirectOwner)
	}
	instance := readInstance(cfg.StateFile)
	if instance == "" {
		instance = newInstance() // saved with the state at start-up, before any sandbox is made
	}
	l := &Ledger{
		cfg:         cfg,
		providers:   providers,
		names:       names,
		log:         slog.New(slog.DiscardHandler),
		obs:         noObserver{},
		store:       &store{path: cfg.StateFile, instance: instance},
		instance:    instance,
		stateKey:    stateKeyOf(cfg.StateFile),
		sandboxes:   map[string]*Record{},
		reservedBy:  map[string]int{},
		workdirs:    map[string]bool{},
		removeSlots: make(chan struct{}, 4),
		stop:        make(chan struct{}),
		holds:       map[string]*hold{},
		ended:       endings{retention: cfg.EndedRetention},
		engines:     newEngines(providers),
		keys:        map[string]*keyed{},
		listedAt:    map[string]time.Time{},
	}
	for _, o := range opts {
		o(l)
	}
	popts := append([]pool.Option{
		pool.WithLogger(l.log),
		pool.WithOwner(l.Owner()),
		pool.WithHooks(pool.Hooks{Created: l.pooledCreated, Destroyed: l.pooledDestroyed}),
	}, l.poolOpts...)
	if cfg.PoolConcurrency > 0 {
		popts = append(popts, pool.WithConcurrency(cfg.PoolConcurrency))
	}
	if l.tracer != nil {
		popts = append(popts, pool.WithTracer(l.tracer))
	}
	m, err := pool.NewManager(providers, cfg.Pools, popts...)
	if err != nil {
		return nil, err
	}
	l.pools = m
	return l, nil
}

// Start takes the state file's lock, loads the state a previous daemon left and
// reconciles it with the providers, then starts the pools, the reaper, the engine checks
// and the watch of sandbox events. The edge claims its socket first, so that a second
// daemon on it fails before it reads the state, and serves once Start returns.
func (l *Ledger) Start(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(l.cfg.StateFile), 0o700); err != nil {
		return fmt.Errorf("creating the state file's directory: %w", err)
	}
	unlock, err := lockState(l.cfg.StateFile)
	if err != nil {
		return err
	}
	if err := l.elect(); err != nil {
		unlock()
		return err
	}
	if err := l.recover(ctx); err != nil {
		l.stopElections()
		unlock()
		return err
	}
	l.unlockState = unlock

	l.pools.Start()
	l.bg.Add(2)
	go l.reapLoop()
	go l.watchEngines()
	l.watchSandboxes()
	return nil
}

// Close stops the background work, drains the pools, finishes pending removals and
// saves the state. The sandboxes clients hold are left running for the next daemon to
// adopt. The edge stops serving first. A ledger that never started closes too.
func (l *Ledger) Close(ctx context.Context) (poolDestroyed int, err error) {
	var errs []error
	l.closed.Do(func() {
		close(l.stop)
		l.bg.Wait()
		l.stopElections()
		// The pools get a fresh deadline: leaving idle sandboxes behind is the thing to avoid.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		n, err := l.pools.Close(pctx)
		poolDestroyed = n
		if err != nil {
			errs = append(errs, err)
		}
		l.removals.Wait()
		if l.recovered {
			if err := l.save(); err != nil {
				errs = append(errs, err)
			}
		}
		if l.unlockState != nil {
			l.unlockState()
		}
	})
	return poolDestroyed, errors.Join(errs...)
}

// StateFile is the file the state is kept in.
func (l *Ledger) StateFile() string { return l.cfg.StateFile }

// Providers are the names of the providers served, sorted.
func (l *Ledger) Providers() []string { return slices.Clone(l.names) }

// Provider returns the named provider ("" is the default, Config.DefaultProvider, or
// the only one served); a name this daemon does not serve is refused with those it does.
func (l *Ledger) Provider(name string) (roche.Provider, error) {
	if name == "" {
		if p, ok := l.providers[l.cfg.DefaultProvider]; ok && l.cfg.DefaultProvider != "" {
			return p, nil
		}
		if len(l.names) == 1 {
			return l.providers[l.names[0]], nil
		}
	}
	if p, ok := l.providers[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("%w: unknown provider %q: this daemon serves %s", roche.ErrInvalidConfig, name, strings.Join(l.names, ", "))
}

// Pools are the warm pools.
func (l *Ledger) Pools() []*pool.Pool { return l.pools.Pools() }

// SelectPools returns the pool named by key, or every pool when key is empty.
func (l *Ledger) SelectPools(key string) ([]*pool.Pool, error) {
	if key == "" {
		return l.pools.Pools(), nil
	}
	k, err := pool.ParseKey(key)
	if err != nil {
		return nil, err
	}
	p, err := l.pools.Get(k)
	if err != nil {
		return nil, err
	}
	return []*pool.Pool{p}, nil
}
