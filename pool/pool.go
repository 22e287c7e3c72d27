// Package pool keeps warm sandboxes ready so that a create is served in milliseconds
// instead of the seconds (or hundreds of milliseconds) a backend needs to make one.
//
// A Pool holds idle sandboxes for one (provider, image) Key and refills itself in the
// background. Refill counts creations in flight, so however often it is triggered it
// never makes more than the pool's bounds allow, and all pools of a Manager share a
// bounded number of concurrent creations. A sandbox handed out by Acquire leaves the
// pool for good: it is never handed out again.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Hooks let the owner of the pools persist what they do, so that the idle pool
// sandboxes of a crashed daemon can be recognised (and destroyed) after a restart.
// They are called without any pool lock held.
type Hooks struct {
	// Created is called for a new sandbox before it can be acquired.
	Created func(key Key, sb roche.SandboxInfo)
	// Destroyed is called after the pool destroyed one of its idle sandboxes.
	Destroyed func(key Key, id string)
}

// Option configures a Manager.
type Option func(*Manager)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(m *Manager) { m.log = l } }

// DefaultConcurrency is how many sandboxes the pools create at once to begin with, and
// at least, unless told: the machine's cores, at least 2. Making a sandbox is mostly
// CPU time on most providers, so more at once only makes each slower; the limit rises
// above it, to four times as many, only while creations wait for a slot and the CPUs
// have room (see limiter.adapt).
func DefaultConcurrency() int { return max(2, runtime.NumCPU()) }

// WithConcurrency fixes how many sandboxes all pools together create at once; without
// it the number adapts, from DefaultConcurrency up to four times as many.
func WithConcurrency(n int) Option {
	return func(m *Manager) { m.slots, m.adaptive = newLimiter(max(n, 1), max(n, 1)), false }
}

// withIdleSource replaces the host's CPU idle readings an adaptive limit follows (tests).
func withIdleSource(f func() (float64, bool), every time.Duration) Option {
	return func(m *Manager) { m.idle, m.adaptEvery = f, every }
}

// WithHooks sets the hooks.
func WithHooks(h Hooks) Option { return func(m *Manager) { m.hooks = h } }

// WithJanitorInterval sets how often idle timeouts are checked and pools topped up
// (default 1 s).
func WithJanitorInterval(d time.Duration) Option { return func(m *Manager) { m.janitorEvery = d } }

// WithCreateTimeout bounds one sandbox creation (default 2 minutes).
func WithCreateTimeout(d time.Duration) Option { return func(m *Manager) { m.createTimeout = d } }

// DefaultProbeTimeout bounds the check that a pooled sandbox is alive before it is
// handed out: one that answers does so in well under a millisecond.
const DefaultProbeTimeout = time.Second

// WithProbeTimeout bounds the check, before each hand-out, that the sandbox is alive
// (default DefaultProbeTimeout). Zero turns the check off, so that a pool may hand out a
// sandbox that died while idle; it is there to measure what the check costs.
func WithProbeTimeout(d time.Duration) Option { return func(m *Manager) { m.probeTimeout = d } }

// WithOwner sets the owner (kit.CreateOptions) of every sandbox the pools create, so that the daemon
// can tell its own idle sandboxes from everyone else's on a shared engine.
func WithOwner(owner string) Option { return func(m *Manager) { m.owner = owner } }

// Manager owns the pools of a daemon.
type Manager struct {
	log           *slog.Logger
	slots         *limiter
	adaptive      bool
	idle          func() (float64, bool) // nil: the host's (cpuIdle)
	adaptEvery    time.Duration
	hooks         Hooks
	janitorEvery  time.Duration
	createTimeout time.Duration
	probeTimeout  time.Duration
	owner         string
	tracer        trace.Tracer // nil: no spans (trace.go)

	pools []*Pool // in the order given
	byKey map[Key]*Pool

	stop    chan struct{}
	stopped sync.WaitGroup
	once    sync.Once
}

// NewManager makes a pool for each spec; providers maps provider names to backends.
// Nothing is created until Start.
func NewManager(providers map[string]roche.Provider, specs []Spec, opts ...Option) (*Manager, error) {
	m := &Manager{
		log:           slog.New(slog.DiscardHandler),
		slots:         newLimiter(DefaultConcurrency(), 4*DefaultConcurrency()),
		adaptive:      true,
		adaptEvery:    adaptEvery,
		janitorEvery:  time.Second,
		createTimeout: 2 * time.Minute,
		probeTimeout:  DefaultProbeTimeout,
		byKey:         map[Key]*Pool{},
		stop:          make(chan struct{}),
	}
	for _, o := range opts {
		o(m)
	}
	var errs []error
	for _, s := range specs {
		if err := s.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		p, ok := providers[s.Provider]
		if !ok {
			names := make([]string, 0, len(providers))
			for n := range providers {
				names = append(names, n)
			}
			sort.Strings(names)
			errs = append(errs, fmt.Errorf("%w: pool %s: unknown provider %q: choose one of %v", roche.ErrInvalidConfig, s.Key, s.Provider, names))
			continue
		}
		if s.Code != "" {
			_, warms := p.(kit.CodeWarmer)
			if !warms || !slices.Contains(p.Capabilities().Code, s.Code) {
				errs = append(errs, fmt.Errorf("%w: pool %s: code=%s: provider %s cannot start a %s interpreter ahead of its first cell (it serves %v): drop code", roche.ErrInvalidConfig, s.Key, s.Code, s.Provider, s.Code, p.Capabilities().Code))
				continue
			}
		}
		if _, dup := m.byKey[s.Key]; dup {
			errs = append(errs, fmt.Errorf("%w: pool %s is given twice: give each provider/image once", roche.ErrInvalidConfig, s.Key))
			continue
		}
		pl := &Pool{spec: s, cfg: s.Config(), provider: p, m: m, inUse: map[string]struct{}{}, changed: make(chan struct{})}
		// Held by this process, where the provider has leases: a process killed while
		// it keeps a pool (mid-refill, say) leaves no idle sandbox that lives on for
		// minutes. Whoever takes one out ends the lease or takes it over (kit.Leaser).
		pl.opts = kit.CreateOptions{Owner: m.owner, Leased: p.Capabilities().Leases}
		m.pools = append(m.pools, pl)
		m.byKey[s.Key] = pl
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// Start fills every pool to its minimum in the background and starts the janitor,
// which destroys sandboxes idle past their timeout and tops pools up.
func (m *Manager) Start() {
	for _, p := range m.pools {
		p.refill()
	}
	if m.adaptive {
		idle := m.idle
		if idle == nil {
			idle = cpuIdle()
		}
		// The adaptive limit on creations at once follows the host's idle CPU.
		m.every(m.adaptEvery, func() {
			f, ok := idle()
			if !ok {
				return
			}
			if from, to := m.slots.adapt(f); from != to {
				m.log.Debug("pool: sandboxes created at once", "from", from, "to", to, "cpu_idle", fmt.Sprintf("%.0f%%", 100*f))
			}
		})
	}
	m.every(m.janitorEvery, func() {
		for _, p := range m.pools {
			p.expireIdle()
			p.refill()
		}
	})
}

// every runs f every d, in a goroutine of its own, until Close.
func (m *Manager) every(d time.Duration, f func()) {
	m.stopped.Add(1)
	go func() {
		defer m.stopped.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				f()
			}
		}
	}()
}

// Pools returns the pools in the order they were given.
func (m *Manager) Pools() []*Pool { return append([]*Pool(nil), m.pools...) }

// Get returns the pool for key, or ErrNotFound.
func (m *Manager) Get(key Key) (*Pool, error) {
	if p, ok := m.byKey[key]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("%w: no pool %s (roche pool status lists them)", roche.ErrNotFound, key)
}

// Match returns the pool that can serve a create for cfg on provider, or nil.
func (m *Manager) Match(provider string, cfg roche.Config) *Pool {
	p := m.byKey[Key{Provider: provider, Image: cfg.Image}]
	if p == nil || !p.spec.Matches(provider, cfg) {
		return nil
	}
	return p
}

// Close stops refilling, destroys every idle sandbox and waits for creations in flight
// (whose sandboxes are destroyed as they arrive). Sandboxes already handed out are the
// caller's and are left alone. It returns how many sandboxes it destroyed.
func (m *Manager) Close(ctx context.Context) (int, error) {
	m.once.Do(func() { close(m.stop) })
	m.stopped.Wait()
	n := 0
	var errs []error
	for _, p := range m.pools {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		d, err := p.Drain(ctx)
		n += d
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

// Pool keeps idle sandboxes of one Key.
type Pool struct {
	spec     Spec
	cfg      roche.Config
	opts     kit.CreateOptions // whose the sandboxes are, and leased
	provider roche.Provider
	m        *Manager

	mu       sync.Mutex
	idle     []member // oldest first
	creating int
	// probing counts sandboxes taken from idle and being checked before hand-out; they
	// count towards the bounds as idle ones do.
	probing  int
	inUse    map[string]struct{}
	target   int // idle sandboxes wanted now: MinIdle, or more after a warmup
	drained  bool
	closed   bool
	hits     uint64
	misses   uint64
	dead     uint64
	failures int
	lastErr  error
	backoff  time.Time // no refill before this, after failures
	wg       sync.WaitGroup
	// changed is closed and replaced whenever idle or creating changes, so that
	// waiters (Warmup, Drain) can select on it together with their context.
	changed chan struct{}
	// waiting holds the creates waiting for the next sandbox (Spec.MaxQueue), oldest
	// first; a new sandbox goes to the oldest before it is idle.
	waiting []*waiter
	// demand counts the creates of recent seconds and what making a sandbox takes, to
	// size the pool between MinIdle and MaxIdle.
	demand demand

	// tmplMu is held while the template is made, so that one is made at a time.
	tmplMu sync.Mutex
	// tmpl is the memory snapshot the pool refills from (kit.Templater), "" before the
	// first; tmplOff: the provider cannot make one for this pool, which boots each.
	tmpl    kit.Template
	tmplOff bool
}

// waiter is a create waiting for the pool's next sandbox.
type waiter struct {
	got chan roche.SandboxInfo // buffered: the pool never blocks handing one over
	err chan error             // buffered: why no sandbox will come
}

// demandWindow is how far back the pool looks to size itself.
const demandWindow = 10 * time.Second

// serveWindow is how far back the pool looks for the rate at which it hands sandboxes to
// waiting creates.
const serveWindow = 3 * time.Second

// demand tracks creates per second and the time one sandbox takes to make.
type demand struct {
	asks []time.Time   // creates in the last demandWindow, oldest first
	make time.Duration // moving average of a creation's duration
	// served: sandboxes handed to waiting creates in the last serveWindow, oldest first:
	// the rate the pool makes them when it cannot keep up, which is what a queued create
	// waits on. A creation's duration alone overstates that rate on a saturated host,
	// where the creates at once do not each finish in the time one takes.
	served []time.Time
}

func (d *demand) serve(now time.Time) {
	d.served = append(since(d.served, now, serveWindow), now)
}

// wait is what a create joining a queue of n others can expect. When the pool has
// lately been serving a queue: n+1 times the interval it has served at, and no less
// than n/conc+1 creations' durations (conc made at once). Before that, n+1 creations'
// durations, as if made one at a time: a burst is when the sandboxes' own work takes
// the CPUs the creations had, and here a burst of 50 admitted at conc at once waited
// twice what it was told (35 queued expecting under 0.5 s waited up to 1 s, the oci
// load's whole p99), while the served rate predicted the rest to within a fifth.
func (d *demand) wait(now time.Time, n, conc int) time.Duration {
	if each, ok := d.servedEach(now); ok {
		return max(time.Duration((n+conc)/conc)*d.make, time.Duration(n+1)*each)
	}
	return time.Duration(n+1) * d.make
}

// servedEach is the interval at which the pool has lately handed sandboxes to waiting
// creates, when it handed at least three in the last serveWindow.
func (d *demand) servedEach(now time.Time) (time.Duration, bool) {
	d.served = since(d.served, now, serveWindow)
	if k := len(d.served); k >= 3 {
		return now.Sub(d.served[0]) / time.Duration(k), true
	}
	return 0, false
}

// interval is the time between two sandboxes the pool makes: at the rate it has lately
// served its queue, else a creation's duration (as wait assumes).
func (d *demand) interval(now time.Time) time.Duration {
	if each, ok := d.servedEach(now); ok {
		return each
	}
	return d.make
}

// retryHint bounds the wait a refused create is told to take before asking again. The
// pools tell it the time they take to serve the creates waiting now (at least the time
// to make one): the queue it found is served by then. A shorter hint, the time until
// the wait is back within the bound, brought the refused clients back together to be
// refused again: 7,000 refusals in 10 s of the oci load (6,000 with a fixed 50 ms
// back-off). This one: 650, and 11% more cycles than the fixed back-off.
func retryHint(d time.Duration) time.Duration {
	return min(max(d, 10*time.Millisecond), 10*time.Second).Round(time.Millisecond)
}

func (d *demand) ask(now time.Time) {
	d.asks = append(since(d.asks, now, demandWindow), now)
}

// since drops the times (oldest first) more than window before now.
func since(ts []time.Time, now time.Time, window time.Duration) []time.Time {
	i := 0
	for i < len(ts) && now.Sub(ts[i]) > window {
		i++
	}
	return ts[i:]
}

func (d *demand) made(took time.Duration) {
	if d.make == 0 {
		d.make = took
		return
	}
	d.make = (3*d.make + took) / 4
}

// depth is how many idle sandboxes cover the creates that arrive while one is made
// (Little's law), with half again for bursts.
func (d *demand) depth(now time.Time) int {
	d.asks = since(d.asks, now, demandWindow)
	if len(d.asks) == 0 || d.make == 0 {
		return 0
	}
	// Over the time the creates seen span, so that a burst counts as the rate it has.
	span := max(now.Sub(d.asks[0]), time.Second)
	perSecond := float64(len(d.asks)) / span.Seconds()
	return int(math.Ceil(perSecond * d.make.Seconds() * 1.5))
}

type member struct {
	info      roche.SandboxInfo
	idleSince time.Time
}

// Status is a snapshot of a pool.
type Status struct {
	Spec     Spec
	Idle     int
	Creating int
	InUse    int
	// Waiting counts creates waiting for the pool's next sandbox (Spec.MaxQueue).
	Waiting int
	// Target is how many idle sandboxes the pool keeps now: MinIdle, or more (up to
	// MaxIdle) while demand or a warmup asks for them.
	Target int
	Hits   uint64
	Misses uint64
	// Dead counts idle sandboxes found dead (by the check before hand-out, or reported
	// by the owner through Discard) and replaced.
	Dead    uint64
	Drained bool
	LastErr error
}

// Spec returns the pool's settings.
func (p *Pool) Spec() Spec { return p.spec }

// Status reports the pool's counts.
func (p *Pool) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Status{
		Spec: p.spec, Idle: len(p.idle), Creating: p.creating, InUse: len(p.inUse),
		Waiting: len(p.waiting), Target: p.targetLocked(time.Now()),
		Hits: p.hits, Misses: p.misses, Dead: p.dead, Drained: p.drained, LastErr: p.lastErr,
	}
}

// notifyLocked wakes waiters; p.mu must be held.
func (p *Pool) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Acquire hands out an idle sandbox, which leaves the pool for good, and triggers a
// refill. ok is false (a miss) when none is ready. Each sandbox is checked alive first,
// within the probe timeout (the provider's kit.Prober, else Inspect): one that died
// while idle (its engine restarted, someone killed it) is destroyed and the next one
// tried, so a dead sandbox is never handed out.
func (p *Pool) Acquire(ctx context.Context) (sb roche.SandboxInfo, ok bool) {
	defer p.refill()
	p.mu.Lock()
	p.demand.ask(time.Now())
	p.mu.Unlock()
	for {
		m, found := p.take()
		if !found {
			p.mu.Lock()
			p.misses++
			p.mu.Unlock()
			return roche.SandboxInfo{}, false
		}
		err := p.probe(ctx, m.info.ID)
		p.mu.Lock()
		p.probing--
		switch {
		case err == nil:
			p.hits++
			p.inUse[m.info.ID] = struct{}{}
			p.notifyLocked()
			p.mu.Unlock()
			return m.info, true
		case ctx.Err() != nil:
			// The caller gave up, which says nothing of the sandbox: it goes back.
			if !p.closed && !p.drained {
				p.idle = append([]member{m}, p.idle...)
			} else {
				p.destroyLocked([]member{m}, "pool drained")
			}
			p.misses++
			p.notifyLocked()
			p.mu.Unlock()
			return roche.SandboxInfo{}, false
		}
		p.dead++
		p.notifyLocked()
		p.destroyLocked([]member{m}, "dead")
		p.mu.Unlock()
		p.m.log.Warn("pool: an idle sandbox was dead: discarded it and trying the next", "pool", p.spec.Key.String(), "id", m.info.ID, "err", err)
	}
}

// Wait queues for the pool's next sandbox after Acquire missed, when the pool has a
// queue (Spec.MaxQueue): the sandbox the pool makes next goes to the oldest create
// waiting, so creates at a burst are served at the rate the engine can make sandboxes
// instead of each making its own at once and slowing every other down. It returns ok
// false, and no error, when the pool has no queue or cannot make sandboxes now (drained,
// backing off after failures): the caller makes its own. A full queue, or a wait
// expected past Spec.MaxWait or ctx's deadline, is refused at once with
// roche.ErrExhausted; the wait ends at ctx's deadline, or after the pool's create
// timeout when ctx has none.
func (p *Pool) Wait(ctx context.Context) (roche.SandboxInfo, bool, error) {
	p.mu.Lock()
	if p.spec.MaxQueue == 0 || p.closed || p.drained || time.Now().Before(p.backoff) {
		p.mu.Unlock()
		return roche.SandboxInfo{}, false, nil
	}
	if len(p.waiting) >= p.spec.MaxQueue {
		n := len(p.waiting)
		now, conc := time.Now(), p.m.slots.current()
		after := retryHint(max(p.demand.wait(now, n, conc), p.demand.interval(now)))
		p.mu.Unlock()
		return roche.SandboxInfo{}, false, kit.RetryAfter(fmt.Errorf("%w: pool %s has no idle sandbox and %d creates are already waiting for one (its queue): retry in %s, or raise the pool's max or queue",
			roche.ErrExhausted, p.spec.Key, n, after), after)
	}
	// The wait this create can expect (demand.wait): the creates before it and itself,
	// at the rate the pool has been making sandboxes.
	limit := p.spec.MaxWait
	if deadline, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(deadline))
	}
	if n := len(p.waiting); n > 0 || p.demand.make > 0 {
		now, conc := time.Now(), p.m.slots.current()
		if expect := p.demand.wait(now, n, conc); expect > limit {
			after := retryHint(max(expect, p.demand.interval(now)))
			perSandbox := p.demand.make // read under the lock: a creation ending updates it
			p.mu.Unlock()
			return roche.SandboxInfo{}, false, kit.RetryAfter(fmt.Errorf("%w: pool %s has no idle sandbox and would make this create wait about %s (%d waiting, %s to make one), over %s: retry in %s, or raise the pool's max or wait",
				roche.ErrExhausted, p.spec.Key, expect.Round(time.Millisecond), n, perSandbox.Round(time.Millisecond), limit.Round(time.Millisecond), after), after)
		}
	}
	w := &waiter{got: make(chan roche.SandboxInfo, 1), err: make(chan error, 1)}
	p.waiting = append(p.waiting, w)
	p.notifyLocked()
	p.mu.Unlock()
	p.refill()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.m.createTimeout)
		defer cancel()
	}
	select {
	case sb := <-w.got:
		return sb, true, nil
	case err := <-w.err:
		return roche.SandboxInfo{}, false, err
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.waiting {
		if x == w {
			p.waiting = append(p.waiting[:i:i], p.waiting[i+1:]...)
			p.notifyLocked()
			return roche.SandboxInfo{}, false, fmt.Errorf("%w: waiting for pool %s's next sandbox: %w", roche.ErrTimeout, p.spec.Key, ctx.Err())
		}
	}
	// Handed over just as the wait ended: the sandbox goes back, as with Acquire.
	select {
	case sb := <-w.got:
		delete(p.inUse, sb.ID)
		p.hits--
		if !p.closed && !p.drained {
			p.idle = append([]member{{info: sb, idleSince: time.Now()}}, p.idle...)
		} else {
			p.destroyLocked([]member{{info: sb}}, "pool drained")
		}
		p.notifyLocked()
	default:
	}
	return roche.SandboxInfo{}, false, fmt.Errorf("%w: waiting for pool %s's next sandbox: %w", roche.ErrTimeout, p.spec.Key, ctx.Err())
}

// take removes the oldest idle sandbox that is not past its idle timeout, counting it
// as being probed.
func (p *Pool) take() (member, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var stale []member
	defer func() { p.destroyLocked(stale, "idle timeout") }()
	now := time.Now()
	for len(p.idle) > 0 {
		m := p.idle[0]
		p.idle = p.idle[1:]
		// The janitor may not have run yet: never hand out a sandbox idle past its
		// timeout, whose remaining lifetime could be shorter than promised.
		if now.Sub(m.idleSince) >= p.spec.IdleTimeout {
			stale = append(stale, m)
			continue
		}
		p.probing++
		p.notifyLocked()
		return m, true
	}
	if len(stale) > 0 {
		p.notifyLocked()
	}
	return member{}, false
}

// probe checks that an idle sandbox is alive and answers, within the probe timeout.
func (p *Pool) probe(ctx context.Context, id string) error {
	if p.m.probeTimeout <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.m.probeTimeout)
	defer cancel()
	if pr, ok := p.provider.(kit.Prober); ok {
		return pr.Probe(ctx, id)
	}
	info, err := p.provider.Inspect(ctx, id)
	if err != nil {
		return err
	}
	if info.State != roche.StateRunning {
		return fmt.Errorf("%w: sandbox %s is %s", roche.ErrUnavailable, id, info.State)
	}
	return nil
}

// Forget tells the pool that a sandbox it handed out is gone, so it no longer counts
// towards MaxTotal.
func (p *Pool) Forget(id string) {
	p.mu.Lock()
	_, was := p.inUse[id]
	delete(p.inUse, id)
	p.mu.Unlock()
	if was {
		p.refill()
	}
}

// IdleIDs lists the idle sandboxes, oldest first.
func (p *Pool) IdleIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, len(p.idle))
	for i, m := range p.idle {
		ids[i] = m.info.ID
	}
	return ids
}

// Provider is the backend the pool creates its sandboxes with.
func (p *Pool) Provider() roche.Provider { return p.provider }

// Discard drops an idle sandbox that died or vanished behind the pool's back (killed,
// stopped by its engine, removed on the engine directly), so it is not handed out dead,
// and refills to replace it. It reports whether the sandbox was idle here: one the pool
// is destroying itself (idle timeout, drain) or handing out is not.
func (p *Pool) Discard(id string) bool {
	found := false
	p.mu.Lock()
	for i, m := range p.idle {
		if m.info.ID == id {
			p.idle = append(p.idle[:i:i], p.idle[i+1:]...)
			p.dead++
			p.notifyLocked()
			found = true
			break
		}
	}
	p.mu.Unlock()
	p.refill()
	return found
}

// TrackInUse counts a sandbox handed out before a restart towards MaxTotal.
func (p *Pool) TrackInUse(id string) {
	p.mu.Lock()
	p.inUse[id] = struct{}{}
	p.mu.Unlock()
}

// refill starts creations until idle plus creating reaches the target, within MaxIdle
// and MaxTotal. Creations are counted before they start, so concurrent refills cannot
// over-create.
func (p *Pool) refill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.drained || time.Now().Before(p.backoff) {
		return
	}
	have := len(p.idle) + p.probing + p.creating
	// Sandboxes for the creates waiting go to them, not to idle: MaxIdle does not
	// bound those.
	want := p.targetLocked(time.Now()) + len(p.waiting) - have
	want = min(want, p.spec.MaxIdle+len(p.waiting)-have)
	if p.spec.MaxTotal > 0 {
		want = min(want, p.spec.MaxTotal-have-len(p.inUse))
	}
	if want <= 0 {
		return
	}
	b := p.startBatch(want)
	for range want {
		p.creating++
		p.wg.Add(1)
		go p.create(b)
	}
}

// targetLocked is the idle sandboxes wanted now: MinIdle, a warmup's count, or what
// recent demand calls for, within MaxIdle.
func (p *Pool) targetLocked(now time.Time) int {
	return min(max(p.target, p.spec.MinIdle, p.demand.depth(now)), p.spec.MaxIdle)
}

// create makes one sandbox, waiting for a slot of the manager's bounded concurrency;
// b is its refill's span (nil: tracing is off).
func (p *Pool) create(b *batch) {
	defer p.wg.Done()
	if !p.m.slots.acquire(p.m.stop) {
		b.done(false)
		p.mu.Lock()
		p.creating--
		p.notifyLocked()
		p.mu.Unlock()
		return
	}
	// A creation is never cancelled midway, even by Close: an engine call cut short can
	// leave a container nobody knows of. Close waits for it and destroys the result.
	ctx, cancel := context.WithTimeout(context.Background(), p.m.createTimeout)
	ctx, end := b.child(ctx, p.m.tracer)
	start := time.Now()
	info, made, err := p.make(ctx)
	cancel()
	end(info.ID, err)
	p.m.slots.release()

	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.notifyLocked()
	p.creating--
	if err != nil {
		if made {
			p.destroyLocked([]member{{info: info}}, "its interpreter did not start")
		}
		p.failures++
		p.lastErr = err
		// The oldest create waiting hears why now rather than at its deadline.
		if len(p.waiting) > 0 {
			w := p.waiting[0]
			p.waiting = p.waiting[1:]
			w.err <- fmt.Errorf("pool %s could not make a sandbox: %w", p.spec.Key, err)
		}
		// Back off so that a broken image or a stopped engine is not hammered.
		wait := min(time.Duration(1<<min(p.failures, 6))*250*time.Millisecond, 15*time.Second)
		p.backoff = time.Now().Add(wait)
		p.m.log.Warn("pool: creating a sandbox failed", "pool", p.spec.Key.String(), "err", err, "retry_in", wait)
		return
	}
	p.failures, p.lastErr = 0, nil
	p.demand.made(time.Since(start))
	if p.closed || p.drained {
		p.destroyLocked([]member{{info: info}}, "pool drained")
		return
	}
	if len(p.waiting) > 0 {
		w := p.waiting[0]
		p.waiting = p.waiting[1:]
		p.hits++
		p.inUse[info.ID] = struct{}{}
		p.demand.serve(time.Now())
		w.got <- info
		return
	}
	p.idle = append(p.idle, member{info: info, idleSince: time.Now()})
	p.m.log.Debug("pool: sandbox ready", "pool", p.spec.Key.String(), "id", info.ID, "took", time.Since(start))
}

// make makes one sandbox for the pool: restored from the pool's template where the
// provider has them (kit.Templater; the template is made first, its interpreter
// started), else created and its interpreter started. made says a sandbox exists, and
// the Created hook was told, even when err says it is of no use.
func (p *Pool) make(ctx context.Context) (info roche.SandboxInfo, made bool, err error) {
	if tp, t, err := p.template(ctx); err != nil {
		return roche.SandboxInfo{}, false, err
	} else if t != "" {
		info, err := tp.CreateFromTemplate(ctx, t)
		if err != nil {
			// The next creation makes a new template: this one may be what failed.
			p.dropTemplate(t)
			return roche.SandboxInfo{}, false, fmt.Errorf("restoring the pool's memory snapshot: %w", err)
		}
		if p.m.hooks.Created != nil {
			p.m.hooks.Created(p.spec.Key, info)
		}
		return info, true, nil
	}
	info, err = kit.Create(ctx, p.provider, p.cfg, p.opts)
	if err != nil {
		return info, false, err
	}
	if p.m.hooks.Created != nil {
		p.m.hooks.Created(p.spec.Key, info)
	}
	if p.spec.Code != "" {
		if werr := p.provider.(kit.CodeWarmer).WarmCode(ctx, info.ID, p.spec.Code); werr != nil {
			err = fmt.Errorf("starting its %s interpreter: %w", p.spec.Code, werr)
		}
	}
	return info, true, err
}

// template returns the pool's template, made now if there is none yet; t is "" when
// the pool boots its sandboxes (NoSnapshot, or a provider without templates).
func (p *Pool) template(ctx context.Context) (tp kit.Templater, t kit.Template, err error) {
	tp, ok := p.provider.(kit.Templater)
	if !ok || p.spec.NoSnapshot {
		return nil, "", nil
	}
	p.tmplMu.Lock()
	defer p.tmplMu.Unlock()
	if p.tmplOff || p.tmpl != "" {
		return tp, p.tmpl, nil
	}
	start := time.Now()
	t, err = tp.MakeTemplate(ctx, p.cfg, p.opts, p.spec.Code)
	if errors.Is(err, roche.ErrUnsupported) {
		p.tmplOff = true
		p.m.log.Info("pool: the provider makes no memory snapshot for this pool; it boots each sandbox", "pool", p.spec.Key.String(), "why", err)
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("making the pool's memory snapshot: %w", err)
	}
	p.tmpl = t
	p.m.log.Info("pool: refills from a memory snapshot", "pool", p.spec.Key.String(), "template", string(t), "took", time.Since(start).Round(time.Millisecond))
	return tp, t, nil
}

// dropTemplate removes template t if it is still the pool's ("" for any).
func (p *Pool) dropTemplate(t kit.Template) {
	p.tmplMu.Lock()
	defer p.tmplMu.Unlock()
	if p.tmpl == "" || (t != "" && p.tmpl != t) {
		return
	}
	p.provider.(kit.Templater).DropTemplate(p.tmpl)
	p.tmpl = ""
}

// destroyLocked destroys idle sandboxes in the background; p.mu must be held. The
// goroutines are counted in p.wg so that Drain and Close wait for them.
func (p *Pool) destroyLocked(ms []member, why string) {
	for _, m := range ms {
		p.wg.Add(1)
		go func(id string) {
			defer p.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := p.provider.Destroy(ctx, id); err != nil {
				// The record stays with the owner (Destroyed is not called), so a restart
				// of the daemon destroys it; the sandbox's own lifetime bounds it anyway.
				p.m.log.Warn("pool: destroying an idle sandbox", "pool", p.spec.Key.String(), "id", id, "err", err)
				return
			}
			p.m.log.Debug("pool: idle sandbox destroyed", "pool", p.spec.Key.String(), "id", id, "why", why)
			if p.m.hooks.Destroyed != nil {
				p.m.hooks.Destroyed(p.spec.Key, id)
			}
		}(m.info.ID)
	}
}

// expireIdle destroys sandboxes idle for longer than the idle timeout.
func (p *Pool) expireIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	keep := p.idle[:0:0]
	var stale []member
	for _, m := range p.idle {
		if now.Sub(m.idleSince) >= p.spec.IdleTimeout {
			stale = append(stale, m)
		} else {
			keep = append(keep, m)
		}
	}
	if len(stale) > 0 {
		p.idle = keep
		p.notifyLocked()
		p.destroyLocked(stale, "idle timeout")
	}
}

// Warmup resumes a drained pool and fills it to count idle sandboxes (MinIdle when
// count is 0; never more than MaxIdle), waiting until they are ready. Later refills
// keep it at that level until the next Drain.
func (p *Pool) Warmup(ctx context.Context, count int) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("%w: pool %s is shutting down", roche.ErrUnavailable, p.spec.Key)
	}
	if count <= 0 {
		count = p.spec.MinIdle
	}
	if count > p.spec.MaxIdle {
		p.mu.Unlock()
		return fmt.Errorf("%w: pool %s: warmup to %d is above its max of %d idle sandboxes: ask for fewer or raise max",
			roche.ErrInvalidConfig, p.spec.Key, count, p.spec.MaxIdle)
	}
	p.drained = false
	p.target = count
	p.backoff = time.Time{} // an operator asking now deserves a try now
	p.mu.Unlock()
	p.refill()
	for {
		p.mu.Lock()
		idle, creating, lastErr, changed := len(p.idle), p.creating, p.lastErr, p.changed
		limited := p.spec.MaxTotal > 0 && len(p.idle)+p.probing+p.creating+len(p.inUse) >= p.spec.MaxTotal
		p.mu.Unlock()
		switch {
		case idle >= count:
			return nil
		case creating == 0 && lastErr != nil:
			return fmt.Errorf("warming pool %s: %w", p.spec.Key, lastErr)
		case creating == 0 && limited:
			return fmt.Errorf("%w: pool %s reached its total of %d sandboxes with %d idle: raise total or destroy sandboxes",
				roche.ErrExhausted, p.spec.Key, p.spec.MaxTotal, idle)
		case creating == 0:
			p.refill()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("warming pool %s: %d of %d ready: %w", p.spec.Key, idle, count, ctx.Err())
		case <-changed:
		case <-time.After(250 * time.Millisecond): // a refill may be waiting out a backoff
		}
	}
}

// Drain destroys every idle sandbox and stops refilling until the next Warmup. It
// waits for creations in flight, whose sandboxes are destroyed too, and returns how
// many sandboxes it destroyed.
func (p *Pool) Drain(ctx context.Context) (int, error) {
	p.mu.Lock()
	p.drained = true
	p.target = 0
	for _, w := range p.waiting {
		w.err <- fmt.Errorf("%w: pool %s was drained while this create waited for it", roche.ErrUnavailable, p.spec.Key)
	}
	p.waiting = nil
	n := len(p.idle)
	p.destroyLocked(p.idle, "drain")
	p.idle = nil
	p.notifyLocked()
	p.mu.Unlock()

	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return n, fmt.Errorf("draining pool %s: %w (the rest is destroyed in the background)", p.spec.Key, ctx.Err())
	}
	// No creation is in flight: the memory snapshot goes too (a Warmup makes another).
	p.dropTemplate("")
	return n, nil
}
