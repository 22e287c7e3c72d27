// Package daemon is roched: the Roche API (roche.v1.SandboxService over gRPC, gRPC-Web
// and Connect's HTTP/JSON) in front of the providers, with warm pools, a reaper that
// destroys sandboxes at their expiry, admission control, and state kept on disk so that
// a restarted daemon finds what the last one left: it keeps serving the sandboxes
// clients hold and destroys the rest.
package daemon

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/providers"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/pool"
)

// Version is reported by /healthz.
const Version = "0.1.0"

// Config is what the daemon serves and how.
type Config struct {
	// Socket is the unix socket to listen on (mode 0600); empty means client.DefaultSocket().
	Socket string
	// Listen, when set ("tcp://127.0.0.1:7878"), also serves on TCP. It needs Token or
	// Tenants.
	Listen string
	// Token is the bearer token of the one TCP tenant, DefaultTenant, sent as
	// "Authorization: Bearer TOKEN" on every request but /healthz. The unix socket is
	// guarded by its mode and serves LocalTenant.
	Token string
	// Tenants are TCP tenants known by their tokens' hashes (the tokens file).
	Tenants []Tenant
	// AllowMountRoots are host directories below which every TCP tenant may mount; with
	// none (and no tenant's own mount_roots), TCP tenants cannot mount host paths. The
	// local tenant may mount anywhere: the socket's owner can run the provider itself.
	AllowMountRoots []string
	// AllowRootSandboxes lets creates run commands as root (uid or gid 0, or a user
	// name, which the image may map to 0). Off, such creates are refused.
	AllowRootSandboxes bool
	// StateFile keeps the daemon's sandboxes across restarts; empty means beside the socket.
	StateFile string
	// MaxSandboxes bounds the sandboxes handed to clients at once (0: no bound). Idle
	// pooled sandboxes are bounded by their pools instead.
	MaxSandboxes int
	// Pools are the warm pools.
	Pools []pool.Spec
	// PoolConcurrency bounds concurrent pool creations across all pools (default 2).
	PoolConcurrency int
	// ReapInterval is how often expired sandboxes are looked for (default 1 s).
	ReapInterval time.Duration
	// ReconcileInterval is how often the daemon compares its state with the providers'
	// (default 30 s), forgetting sandboxes removed behind its back.
	ReconcileInterval time.Duration
	// HeartbeatInterval is how long ExecStream stays quiet before a heartbeat (default 5 s).
	HeartbeatInterval time.Duration
	// CopyMaxBytes caps the file content one CopyTo or CopyFrom moves (default
	// roche.DefaultCopyMaxBytes); a request may ask for less, not more.
	CopyMaxBytes int64
	// EngineCheckInterval is how often each provider's engine is asked whether it answers
	// (default 2 s; health.go).
	EngineCheckInterval time.Duration
	// MaxUploadBytes bounds one CopyTo upload (default wire.MaxUploadBytes; tests lower it).
	MaxUploadBytes int64
}

// Option configures a Daemon.
type Option func(*Daemon)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(d *Daemon) { d.log = l } }

// WithPoolOptions passes options to the pool manager (tests shorten its janitor).
func WithPoolOptions(opts ...pool.Option) Option {
	return func(d *Daemon) { d.poolOpts = append(d.poolOpts, opts...) }
}

// Daemon is a running roched.
type Daemon struct {
	cfg       Config
	providers map[string]roche.Provider
	names     []string // provider names, sorted
	log       *slog.Logger
	poolOpts  []pool.Option
	pools     *pool.Manager
	store     *store
	metrics   *metrics
	started   time.Time

	mu        sync.Mutex
	sandboxes map[string]*record
	reserved  int // cold creates admitted and in flight
	// reservedBy counts them per tenant.
	reservedBy map[string]int
	seq        uint64
	// verifying: a check of the pools' idle sandboxes is pending (verifyIdleSoon).
	verifying atomic.Bool
	// workdirs remembers, per pool and directory, whether a pooled sandbox can have
	// that workdir (see prepareWorkdir).
	workdirs map[string]bool
	// holds are the Hold streams of leased sandboxes (lease.go).
	holds map[string]*hold
	// ended remembers why client sandboxes ended behind the daemon's back (events.go).
	ended endings

	// output bounds the unary Exec output held at once (output.go).
	output outputBudget
	// engines is whether each provider's engine answers (health.go).
	engines *engines

	removals sync.WaitGroup
	// removeSlots bounds concurrent removals so a burst of destroys cannot starve creates.
	removeSlots chan struct{}

	// recovered: the state file has been read and reconciled, so this daemon owns it
	// and may write it. A daemon that failed to start must not.
	recovered bool
	// unlockState releases the state file's lock (lockState).
	unlockState func()

	// tenants are the TCP tenants; local is the unix socket's.
	tenants []*tenant
	local   *tenant
	// instance and stateKey make up this daemon's owner (see owner.go).
	instance, stateKey string

	stop chan struct{}
	// draining is closed when Shutdown begins: long calls that would hold it up (Hold)
	// end then.
	draining chan struct{}
	bg       sync.WaitGroup
	servers  []*http.Server
	tcpAddr  net.Addr
	shutdown sync.Once
}

// New validates cfg and prepares a daemon; Start makes it serve.
func New(cfg Config, providers map[string]roche.Provider, opts ...Option) (*Daemon, error) {
	if len(providers) == 0 {
		return nil, fmt.Errorf("%w: no providers to serve", roche.ErrInvalidConfig)
	}
	if cfg.Socket == "" {
		cfg.Socket = client.DefaultSocket()
	}
	if cfg.StateFile == "" {
		cfg.StateFile = client.StateFile(cfg.Socket)
	}
	if cfg.PoolConcurrency <= 0 {
		cfg.PoolConcurrency = 2
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = time.Second
	}
	if cfg.CopyMaxBytes <= 0 {
		cfg.CopyMaxBytes = roche.DefaultCopyMaxBytes
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = 30 * time.Second
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 5 * time.Second
	}
	if cfg.EngineCheckInterval <= 0 {
		cfg.EngineCheckInterval = 2 * time.Second
	}
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	if err := cfg.Validate(names); err != nil {
		return nil, err
	}
	instance := readInstance(cfg.StateFile)
	if instance == "" {
		instance = newInstance() // saved with the state at start-up, before any sandbox is made
	}
	d := &Daemon{
		cfg:         cfg,
		providers:   providers,
		log:         slog.New(slog.DiscardHandler),
		store:       &store{path: cfg.StateFile, instance: instance},
		instance:    instance,
		stateKey:    stateKeyOf(cfg.StateFile),
		tenants:     buildTenants(cfg),
		local:       &tenant{name: LocalTenant, local: true},
		sandboxes:   map[string]*record{},
		reservedBy:  map[string]int{},
		workdirs:    map[string]bool{},
		removeSlots: make(chan struct{}, 4),
		stop:        make(chan struct{}),
		draining:    make(chan struct{}),
		holds:       map[string]*hold{},
		output:      outputBudget{left: maxHeldOutput},
		engines:     newEngines(providers),
	}
	for n := range providers {
		d.names = append(d.names, n)
	}
	sort.Strings(d.names)
	for _, o := range opts {
		o(d)
	}
	popts := append([]pool.Option{
		pool.WithLogger(d.log),
		pool.WithOwner(d.poolOwner()),
		pool.WithConcurrency(cfg.PoolConcurrency),
		pool.WithHooks(pool.Hooks{Created: d.pooledCreated, Destroyed: d.pooledDestroyed}),
	}, d.poolOpts...)
	m, err := pool.NewManager(providers, cfg.Pools, popts...)
	if err != nil {
		return nil, err
	}
	d.pools = m
	d.metrics = newMetrics(d)
	return d, nil
}

// Validate reports every problem with the settings at once, for a daemon serving the
// named providers.
func (c Config) Validate(providers []string) error {
	var errs []error
	if c.MaxSandboxes < 0 {
		errs = append(errs, fmt.Errorf("%w: max sandboxes %d is negative: give 0 (no limit) or more", roche.ErrInvalidConfig, c.MaxSandboxes))
	}
	if c.Listen != "" {
		if _, err := parseListen(c.Listen); err != nil {
			errs = append(errs, err)
		} else if c.Token == "" && len(c.Tenants) == 0 {
			errs = append(errs, fmt.Errorf("%w: refusing to listen on %s without a token: anyone who can reach it could run code; pass --token-file FILE (mode 0600), set ROCHE_TOKEN, or give tenants with --tokens-file",
				roche.ErrInvalidConfig, c.Listen))
		}
	}
	errs = append(errs, c.validateTenants()...)
	sort.Strings(providers)
	for _, s := range c.Pools {
		if !slices.Contains(providers, s.Provider) {
			errs = append(errs, fmt.Errorf("%w: pool %s: unknown provider %q: this daemon serves %s",
				roche.ErrInvalidConfig, s.Key, s.Provider, strings.Join(providers, ", ")))
		}
	}
	return errors.Join(errs...)
}

// parseListen parses "tcp://HOST:PORT".
func parseListen(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "tcp" || u.Host == "" || u.Path != "" {
		return "", fmt.Errorf("%w: listen address %q: use tcp://HOST:PORT, e.g. tcp://127.0.0.1:7878", roche.ErrInvalidConfig, s)
	}
	return u.Host, nil
}

// Start claims the socket, reconciles with the providers, starts the pools and the
// reaper, and serves. It returns once the listeners are open.
func (d *Daemon) Start(ctx context.Context) error {
	d.started = time.Now()
	// The socket is claimed first: a second daemon on it must fail before it reads the
	// state file, or it would destroy the running daemon's idle pool as leftovers.
	unixL, err := listenUnix(d.cfg.Socket)
	if err != nil {
		return err
	}
	listeners := []net.Listener{unixL}
	closeAll := func() {
		for _, l := range listeners {
			l.Close()
		}
	}
	if d.cfg.Listen != "" {
		addr, _ := parseListen(d.cfg.Listen)
		tcpL, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("%w: listening on %s: %v", roche.ErrUnavailable, d.cfg.Listen, err)
		}
		d.tcpAddr = tcpL.Addr()
		listeners = append(listeners, tcpL)
	}
	if err := os.MkdirAll(filepath.Dir(d.cfg.StateFile), 0o700); err != nil {
		closeAll()
		return fmt.Errorf("creating the state file's directory: %w", err)
	}
	unlock, err := lockState(d.cfg.StateFile)
	if err != nil {
		closeAll()
		return err
	}
	// Connections wait in the listeners' backlog until recovery is done.
	if err := d.recover(ctx); err != nil {
		closeAll()
		unlock()
		return err
	}
	d.unlockState = unlock

	d.pools.Start()
	d.bg.Add(2)
	go d.reapLoop()
	go d.watchEngines()
	d.watchSandboxes()

	for i, l := range listeners {
		srv := &http.Server{
			// The unix socket is guarded by its mode (0600, owner only) and serves the
			// local tenant; TCP serves whichever tenant the token names.
			Handler:           d.handler(i > 0),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
		}
		// HTTP/1.1 for Connect and curl, cleartext HTTP/2 for gRPC clients.
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
		d.servers = append(d.servers, srv)
		d.bg.Add(1)
		go func(l net.Listener) {
			defer d.bg.Done()
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.Error("serving stopped", "addr", l.Addr().String(), "err", err)
			}
		}(l)
	}
	attrs := []any{"socket", d.cfg.Socket, "state", d.cfg.StateFile, "owner", d.poolOwner(), "providers", d.names,
		"max_sandboxes", d.cfg.MaxSandboxes, "tenants", len(d.tenants)}
	if d.tcpAddr != nil {
		attrs = append(attrs, "tcp", d.tcpAddr.String())
	}
	for _, p := range d.pools.Pools() {
		attrs = append(attrs, "pool", p.Spec().String())
	}
	d.log.Info("roched listening", attrs...)
	return nil
}

// Socket is the unix socket the daemon listens on.
func (d *Daemon) Socket() string { return d.cfg.Socket }

// TCPAddr is the TCP address served, or nil.
func (d *Daemon) TCPAddr() net.Addr { return d.tcpAddr }

// listenUnix opens the socket, mode 0600 in a 0700 directory, refusing to take over a
// socket another daemon still answers on and replacing a stale one.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating the socket's directory: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("%w: another roched already listens on %s: stop it (roche daemon stop) or pass --socket",
			roche.ErrUnavailable, path)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%w: %s exists and is not a socket: remove it or pass another --socket", roche.ErrInvalidConfig, path)
		}
		os.Remove(path) // a dead daemon's socket
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("%w: listening on %s: %v", roche.ErrUnavailable, path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("restricting %s to its owner: %w", path, err)
	}
	return l, nil
}

// handler is the daemon's HTTP handler: the API, /healthz and /metrics, behind the
// token check when asked.
func (d *Daemon) handler(requireToken bool) http.Handler {
	mux := http.NewServeMux()
	opts := append(strictCodecs(),
		// Local clients gain nothing from compressing small messages.
		connect.WithCompressMinBytes(32<<10),
		connect.WithReadMaxBytes(maxMessageBytes),
		connect.WithInterceptors(uploadLimit{max: cmp.Or(d.cfg.MaxUploadBytes, wire.MaxUploadBytes)}),
	)
	path, h := rochev1connect.NewSandboxServiceHandler(&service{d: d}, opts...)
	mux.Handle(path, d.releaseHeld(h))
	// Server reflection, so that grpcurl and buf curl list and call the methods without
	// the .proto at hand; behind the same token check as the API.
	reflector := grpcreflect.NewStaticReflector(rochev1connect.SandboxServiceName)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	mux.HandleFunc("/healthz", d.healthz)
	mux.Handle("/metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{}))
	if !requireToken {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mux.ServeHTTP(w, r.WithContext(withTenant(r.Context(), d.local)))
		})
	}
	return d.authenticate(mux)
}

// maxMessageBytes bounds a request: an Exec carries its stdin whole (roche.MaxStdinBytes,
// a third more as base64 in JSON), with argv and env besides.
const maxMessageBytes = 24 << 20

// authenticate requires a tenant's bearer token on everything but /healthz, answering
// API calls with UNAUTHENTICATED in whichever protocol they speak. The token's hash is
// compared with every tenant's in constant time.
func (d *Daemon) authenticate(next http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if t := match(d.tenants, token); ok && t != nil {
			next.ServeHTTP(w, r.WithContext(withTenant(r.Context(), t)))
			return
		}
		d.log.Warn("unauthenticated request refused", "path", r.URL.Path, "remote", r.RemoteAddr)
		err := connect.NewError(connect.CodeUnauthenticated,
			errors.New("missing or wrong bearer token: send Authorization: Bearer TOKEN (a token roched knows: its --token-file, ROCHE_TOKEN or --tokens-file)"))
		if ew.IsSupported(r) {
			_ = ew.Write(w, r, err)
			return
		}
		http.Error(w, err.Message(), http.StatusUnauthorized)
	})
}

func (d *Daemon) healthz(w http.ResponseWriter, _ *http.Request) {
	d.mu.Lock()
	n := 0
	for _, r := range d.sandboxes {
		if r.Kind == kindClient {
			n++
		}
	}
	d.mu.Unlock()
	engines, allUp := d.engineHealth()
	status := "ok"
	if !allUp {
		// roched itself answers (200), so clients keep reaching it and hear why creates fail.
		status = "degraded"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(client.Health{
		Status: status, Version: Version, PID: os.Getpid(), StartedAt: d.started, Providers: d.names, Sandboxes: n,
		Engines: engines,
	})
}

// Shutdown stops serving (waiting for calls in progress until ctx ends, then cutting
// them off), drains the pools, finishes pending removals and saves the state. The
// sandboxes clients hold are left running for the next daemon to adopt.
func (d *Daemon) Shutdown(ctx context.Context) error {
	var errs []error
	d.shutdown.Do(func() {
		d.log.Info("roched shutting down")
		close(d.draining)
		for _, srv := range d.servers {
			if err := srv.Shutdown(ctx); err != nil {
				srv.Close()
				errs = append(errs, fmt.Errorf("stopping calls in progress: %w", err))
			}
		}
		close(d.stop)
		d.bg.Wait()
		// The pools get a fresh deadline: leaving idle sandboxes behind is the thing to avoid.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		n, err := d.pools.Close(pctx)
		if err != nil {
			errs = append(errs, err)
		}
		d.removals.Wait()
		if d.recovered {
			if err := d.save(); err != nil {
				errs = append(errs, err)
			}
		}
		if d.unlockState != nil {
			d.unlockState()
		}
		d.log.Info("roched stopped", "pool_sandboxes_destroyed", n)
	})
	return errors.Join(errs...)
}

// provider returns the named provider ("" is the default, docker, or the only one
// served); a name this daemon does not serve is refused with those it does.
func (d *Daemon) provider(name string) (roche.Provider, error) {
	if name == "" {
		if p, ok := d.providers[providers.Default]; ok {
			return p, nil
		}
		if len(d.names) == 1 {
			return d.providers[d.names[0]], nil
		}
	}
	if p, ok := d.providers[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("%w: unknown provider %q: this daemon serves %s", roche.ErrInvalidConfig, name, strings.Join(d.names, ", "))
}
