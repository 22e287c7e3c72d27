package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestMain builds roche-agent for the tests against the real engine (a Docker sandbox
// runs commands through it) and checks that no test left a goroutine behind.
func TestMain(m *testing.M) { os.Exit(testenv.RunWithAgent(m)) }

// fakeProvider creates sandboxes that are only map entries, slowly, and records how
// many creations ran at once and how many sandboxes were alive at most.
type fakeProvider struct {
	delay time.Duration
	fail  atomic.Int32 // fail this many creates

	mu         sync.Mutex
	live       map[string]bool
	dead       map[string]bool // killed behind the pool's back
	hung       map[string]bool // never answers a probe
	probes     int
	next       int
	creating   int
	maxCreate  int
	maxLive    int
	created    int
	destroyed  int
	lastConfig roche.Config
	lastOpts   kit.CreateOptions
}

func newFake(delay time.Duration) *fakeProvider {
	return &fakeProvider{delay: delay, live: map[string]bool{}, dead: map[string]bool{}, hung: map[string]bool{}}
}

func (f *fakeProvider) Name() string                     { return "fake" }
func (f *fakeProvider) Capabilities() roche.Capabilities { return roche.Capabilities{} }

func (f *fakeProvider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return f.CreateFor(ctx, cfg, kit.CreateOptions{})
}

func (f *fakeProvider) CreateFor(ctx context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	f.mu.Lock()
	f.creating++
	f.maxCreate = max(f.maxCreate, f.creating)
	f.lastConfig, f.lastOpts = cfg, opts
	f.mu.Unlock()
	time.Sleep(f.delay)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creating--
	if f.fail.Load() > 0 {
		f.fail.Add(-1)
		return roche.SandboxInfo{}, fmt.Errorf("%w: engine down", roche.ErrUnavailable)
	}
	f.next++
	f.created++
	id := fmt.Sprintf("fake-%d", f.next)
	f.live[id] = true
	f.maxLive = max(f.maxLive, len(f.live))
	return roche.SandboxInfo{ID: id, Provider: "fake", Image: cfg.Image, State: roche.StateRunning}, nil
}

func (f *fakeProvider) Exec(context.Context, string, roche.ExecRequest) (roche.ExecResult, error) {
	return roche.ExecResult{}, nil
}

func (f *fakeProvider) Destroy(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.live[id] {
		f.destroyed++
	}
	delete(f.live, id)
	return nil
}

func (f *fakeProvider) Inspect(context.Context, string) (roche.SandboxInfo, error) {
	return roche.SandboxInfo{}, roche.ErrNotFound
}

func (f *fakeProvider) List(context.Context) ([]roche.SandboxInfo, error) { return nil, nil }

// Probe implements kit.Prober: a sandbox is alive until destroyed or killed; a hung
// one answers nothing until ctx ends.
func (f *fakeProvider) Probe(ctx context.Context, id string) error {
	f.mu.Lock()
	f.probes++
	hung := f.hung[id]
	alive := f.live[id] && !f.dead[id]
	f.mu.Unlock()
	if hung {
		<-ctx.Done()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !alive {
		return fmt.Errorf("%w: sandbox %s does not answer", roche.ErrUnavailable, id)
	}
	return nil
}

// kill makes a sandbox die behind the pool's back: it still exists, but no longer answers.
func (f *fakeProvider) kill(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dead[id] = true
}

func (f *fakeProvider) stats() (live, maxLive, maxCreate, created int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live), f.maxLive, f.maxCreate, f.created
}

func newManager(t *testing.T, f roche.Provider, spec string, opts ...Option) (*Manager, *Pool) {
	t.Helper()
	s, err := ParseSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(map[string]roche.Provider{"fake": f}, []Spec{s}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return m, m.Pools()[0]
}

// waitFor polls cond, on the fake clock of the synctest bubble the manager tests run in:
// each poll lets the manager's timers and the fake's creations move on, and costs no
// real time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRefillNeverOverCreates hammers refill from many goroutines while acquiring:
// creations in flight are counted, so the pool never exceeds its bounds and never
// runs more creations at once than the manager allows.
func TestRefillNeverOverCreates(t *testing.T) { synctest.Test(t, refillNeverOverCreates) }

func refillNeverOverCreates(t *testing.T) {
	f := newFake(20 * time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=3&max=4&total=6", WithConcurrency(2), WithJanitorInterval(time.Millisecond))
	m.Start()

	var wg sync.WaitGroup
	var acquired sync.Map
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				p.refill()
				if i%10 == 0 {
					if sb, ok := p.Acquire(context.Background()); ok {
						if _, dup := acquired.LoadOrStore(sb.ID, true); dup {
							t.Errorf("sandbox %s handed out twice", sb.ID)
						}
					}
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	waitFor(t, "the pool to settle", func() bool {
		st := p.Status()
		return st.Creating == 0 && (st.Idle == 3 || st.Idle+st.InUse == 6)
	})
	st := p.Status()
	live, maxLive, maxCreate, _ := f.stats()
	if maxCreate > 2 {
		t.Errorf("%d creations ran at once, want at most 2", maxCreate)
	}
	if maxLive > 6 {
		t.Errorf("%d sandboxes alive at once, want at most total=6", maxLive)
	}
	if live != st.Idle+st.InUse {
		t.Errorf("%d alive, pool accounts for %d idle + %d in use", live, st.Idle, st.InUse)
	}
	if st.Idle > 4 {
		t.Errorf("%d idle, want at most max=4", st.Idle)
	}
}

func TestAcquireHitMissAndRefill(t *testing.T) { synctest.Test(t, acquireHitMissAndRefill) }

func acquireHitMissAndRefill(t *testing.T) {
	f := newFake(5 * time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=2&max=2&idle_timeout=60", WithJanitorInterval(10*time.Millisecond), WithOwner("roched:test"))
	if sb, ok := p.Acquire(context.Background()); ok {
		t.Fatalf("acquired %s from a pool never started", sb.ID)
	}
	m.Start()
	waitFor(t, "two idle", func() bool { return p.Status().Idle == 2 })
	a, okA := p.Acquire(context.Background())
	b, okB := p.Acquire(context.Background())
	if !okA || !okB || a.ID == b.ID {
		t.Fatalf("acquire: %v %v %q %q", okA, okB, a.ID, b.ID)
	}
	waitFor(t, "refill to two idle", func() bool { return p.Status().Idle == 2 })
	st := p.Status()
	if st.Hits != 2 || st.Misses != 1 || st.InUse != 2 {
		t.Fatalf("status %+v, want 2 hits, 1 miss, 2 in use", st)
	}
	// The pooled config carries the pool's image, a lifetime covering idle + max timeout,
	// and the daemon's owner.
	if cfg := f.lastConfig; cfg.Image != "img" || cfg.TimeoutSecs < 60+300 || cfg.Network || cfg.Writable || f.lastOpts.Owner != "roched:test" {
		t.Fatalf("pooled config %+v, options %+v", cfg, f.lastOpts)
	}
	p.Forget(a.ID)
	p.Forget(b.ID)
	if st := p.Status(); st.InUse != 0 {
		t.Fatalf("in use after Forget: %d", st.InUse)
	}
}

func TestIdleTimeoutReplaces(t *testing.T) { synctest.Test(t, idleTimeoutReplaces) }

func idleTimeoutReplaces(t *testing.T) {
	f := newFake(time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=1&idle_timeout=0.2", WithJanitorInterval(20*time.Millisecond))
	m.Start()
	waitFor(t, "one idle", func() bool { return p.Status().Idle == 1 })
	_, _, _, created := f.stats()
	waitFor(t, "the idle sandbox to be replaced", func() bool {
		_, _, _, c := f.stats()
		return c >= created+2 && p.Status().Idle == 1
	})
	f.mu.Lock()
	destroyed := f.destroyed
	f.mu.Unlock()
	if destroyed < 1 {
		t.Fatal("no idle sandbox was destroyed at its idle timeout")
	}
	if live, _, _, _ := f.stats(); live > 2 {
		t.Fatalf("%d alive for a pool of 1", live)
	}
}

func TestDrainAndWarmup(t *testing.T) { synctest.Test(t, drainAndWarmup) }

func drainAndWarmup(t *testing.T) {
	f := newFake(10 * time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=1&max=3&total=4")
	m.Start()
	ctx := context.Background()
	if err := p.Warmup(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); st.Idle != 3 {
		t.Fatalf("after warmup to 3: %+v", st)
	}
	if err := p.Warmup(ctx, 5); err == nil || !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("warmup above max: %v", err)
	}
	n, err := p.Drain(ctx)
	if err != nil || n != 3 {
		t.Fatalf("drain: %d, %v", n, err)
	}
	time.Sleep(3 * time.Second) // a drained pool must not refill, in three janitor rounds
	if live, _, _, _ := f.stats(); live != 0 || p.Status().Idle != 0 || !p.Status().Drained {
		t.Fatalf("after drain: %d alive, %+v", live, p.Status())
	}
	if _, ok := p.Acquire(context.Background()); ok {
		t.Fatal("acquired from a drained pool")
	}
	if err := p.Warmup(ctx, 0); err != nil || p.Status().Idle != 1 {
		t.Fatalf("warmup to min: %v %+v", err, p.Status())
	}
}

func TestWarmupStopsAtTotal(t *testing.T) { synctest.Test(t, warmupStopsAtTotal) }

func warmupStopsAtTotal(t *testing.T) {
	f := newFake(time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=0&max=3&total=3")
	m.Start()
	ctx := context.Background()
	if err := p.Warmup(ctx, 2); err != nil {
		t.Fatal(err)
	}
	a, _ := p.Acquire(context.Background())
	b, _ := p.Acquire(context.Background())
	err := p.Warmup(ctx, 2)
	if !errors.Is(err, roche.ErrExhausted) {
		t.Fatalf("warmup with 2 in use of total 3: %v, want ErrExhausted", err)
	}
	p.Forget(a.ID)
	p.Forget(b.ID)
}

func TestCreateFailuresBackOff(t *testing.T) { synctest.Test(t, createFailuresBackOff) }

func createFailuresBackOff(t *testing.T) {
	f := newFake(0)
	f.fail.Store(1000)
	m, p := newManager(t, f, "fake/img?min=2", WithJanitorInterval(time.Millisecond))
	m.Start()
	time.Sleep(300 * time.Millisecond)
	st := p.Status()
	if st.LastErr == nil || !errors.Is(st.LastErr, roche.ErrUnavailable) {
		t.Fatalf("last error %v", st.LastErr)
	}
	// With a 1 ms janitor and no backoff this would be hundreds of attempts.
	if tried := 1000 - int(f.fail.Load()); tried > 12 {
		t.Fatalf("%d create attempts in 300 ms against a failing engine: no backoff", tried)
	}
	f.fail.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Warmup(ctx, 0); err != nil {
		t.Fatalf("warmup after the engine came back: %v", err)
	}
}

func TestCloseDestroysIdleAndInFlight(t *testing.T) { synctest.Test(t, closeDestroysIdleAndInFlight) }

func closeDestroysIdleAndInFlight(t *testing.T) {
	f := newFake(50 * time.Millisecond)
	s, _ := ParseSpec("fake/img?min=3&max=3")
	var hooked sync.Map
	m, err := NewManager(map[string]roche.Provider{"fake": f}, []Spec{s}, WithConcurrency(3), WithHooks(Hooks{
		Created:   func(_ Key, sb roche.SandboxInfo) { hooked.Store(sb.ID, true) },
		Destroyed: func(_ Key, id string) { hooked.Delete(id) },
	}))
	if err != nil {
		t.Fatal(err)
	}
	m.Start()
	synctest.Wait() // every creation started and is making its sandbox
	if f.mu.Lock(); f.creating != 3 {
		t.Fatalf("%d creations in flight before Close, want 3", f.creating)
	}
	f.mu.Unlock()
	if _, err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if live, _, _, _ := f.stats(); live != 0 {
		t.Fatalf("%d sandboxes alive after Close", live)
	}
	hooked.Range(func(k, _ any) bool {
		t.Errorf("hook still records %v after Close", k)
		return true
	})
}

func TestMatch(t *testing.T) {
	s, err := ParseSpec("docker/roche/python:local?min=1&timeout=600")
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(map[string]roche.Provider{"docker": newFake(0)}, []Spec{s})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	base := roche.DefaultConfig()
	base.Image = "roche/python:local"
	cases := []struct {
		name     string
		provider string
		mod      func(*roche.Config)
		hit      bool
	}{
		{"defaults", "docker", func(*roche.Config) {}, true},
		{"env and workdir apply at exec", "docker", func(c *roche.Config) { c.Env = map[string]string{"A": "1"}; c.Workdir = "/tmp" }, true},
		{"memory spelled differently", "docker", func(c *roche.Config) { c.Memory = "0.5g" }, true},
		{"shorter lifetime", "docker", func(c *roche.Config) { c.TimeoutSecs = 10 }, true},
		{"lifetime up to the pool's max", "docker", func(c *roche.Config) { c.TimeoutSecs = 600 }, true},
		{"lifetime beyond", "docker", func(c *roche.Config) { c.TimeoutSecs = 601 }, false},
		{"network", "docker", func(c *roche.Config) { c.Network = true }, false},
		{"allowlist", "docker", func(c *roche.Config) { c.NetworkAllowlist = []string{"pypi.org"} }, false},
		{"workspace", "docker", func(c *roche.Config) { c.Workspace = "ws" }, false},
		{"snapshot", "docker", func(c *roche.Config) { c.FromSnapshot = "s" }, false},
		{"writable", "docker", func(c *roche.Config) { c.Writable = true }, false},
		{"writable with the pool's disk", "docker", func(c *roche.Config) { c.Writable = true; c.Disk = roche.DefaultDisk }, false},
		{"writable with another disk", "docker", func(c *roche.Config) { c.Writable = true; c.Disk = "100m" }, false},
		{"disk on a read-only root cannot matter", "docker", func(c *roche.Config) { c.Disk = "100m" }, true},
		{"no disk limit on a read-only root", "docker", func(c *roche.Config) { c.Disk = "0" }, true},
		{"mounts", "docker", func(c *roche.Config) { c.Mounts = []roche.Mount{{Source: "/a", Target: "/b"}} }, false},
		{"memory", "docker", func(c *roche.Config) { c.Memory = "1g" }, false},
		{"cpus", "docker", func(c *roche.Config) { c.CPUs = 2 }, false},
		{"pids", "docker", func(c *roche.Config) { c.PidsLimit = 65 }, false},
		{"user", "docker", func(c *roche.Config) { c.User = "1000" }, false},
		// Pooled sandboxes run as uids of their own; one who names a uid gets that one.
		{"the user pooled sandboxes once had", "docker", func(c *roche.Config) { c.User = "65534:65534" }, false},
		{"other image", "docker", func(c *roche.Config) { c.Image = "python:3.12-slim" }, false},
		{"other provider", "wasm", func(*roche.Config) {}, false},
	}
	for _, c := range cases {
		cfg := base
		c.mod(&cfg)
		if got := m.Match(c.provider, cfg) != nil; got != c.hit {
			t.Errorf("%s: match %v, want %v", c.name, got, c.hit)
		}
	}
}

func TestParseSpec(t *testing.T) {
	s, err := ParseSpec("docker/roche/python:local?min=2&max=5&total=20&idle_timeout=600")
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{Key: Key{"docker", "roche/python:local"}, MinIdle: 2, MaxIdle: 5, MaxTotal: 20,
		IdleTimeout: 600 * time.Second, MaxWait: DefaultMaxWait, MaxTimeoutSecs: 300, Memory: "512m", CPUs: 1, PidsLimit: 64}
	if s != want {
		t.Fatalf("got %+v\nwant %+v", s, want)
	}
	// String round-trips.
	if again, err := ParseSpec(s.String()); err != nil || again != s {
		t.Fatalf("round trip of %s: %+v, %v", s, again, err)
	}
	if s, err := ParseSpec("docker/img?code=python"); err != nil || s.Code != "python" {
		t.Fatalf("code: %+v, %v", s, err)
	} else if again, err := ParseSpec(s.String()); err != nil || again != s {
		t.Fatalf("round trip of %s: %+v, %v", s, again, err)
	}
	if s, err := ParseSpec("docker/img"); err != nil || s.MinIdle != 1 || s.MaxIdle != 1 || s.MaxTotal != 0 || s.IdleTimeout != DefaultIdleTimeout {
		t.Fatalf("defaults: %+v, %v", s, err)
	}
	if s, err := ParseSpec("docker/img?idle_timeout=10m&min=0"); err != nil || s.IdleTimeout != 10*time.Minute || s.MaxIdle != 0 {
		t.Fatalf("duration idle_timeout: %+v, %v", s, err)
	}

	bad := []struct{ spec, want string }{
		{"", "PROVIDER/IMAGE"},
		{"docker", "PROVIDER/IMAGE"},
		{"docker/", "PROVIDER/IMAGE"},
		{"docker/img?min=x", `min="x": want a whole number`},
		{"docker/img?min=3&max=2", "max (2) is below min (3)"},
		{"docker/img?max=5&total=2", "total (2) is below max (5)"},
		{"docker/img?idle_timeout=0", "idle_timeout must be positive"},
		{"docker/img?idle_timeout=soon", "idle_timeout"},
		{"docker/img?size=3", `unknown parameter "size"`},
		{"docker/img?memory=lots", `"lots" is not a size`},
		{"docker/img?min=-1&timeout=0", "min is -1"},
	}
	for _, b := range bad {
		_, err := ParseSpec(b.spec)
		if err == nil || !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ParseSpec(%q) = %v, want an invalid-config error containing %q", b.spec, err, b.want)
		}
	}
}

func TestNewManagerRejects(t *testing.T) {
	s, _ := ParseSpec("docker/img")
	_, err := NewManager(map[string]roche.Provider{"fake": newFake(0)}, []Spec{s, s})
	if err == nil || !strings.Contains(err.Error(), `unknown provider "docker"`) {
		t.Fatalf("unknown provider: %v", err)
	}
	_, err = NewManager(map[string]roche.Provider{"docker": newFake(0)}, []Spec{s, s})
	if err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("duplicate: %v", err)
	}
	warm, _ := ParseSpec("docker/img?code=python")
	_, err = NewManager(map[string]roche.Provider{"docker": newFake(0)}, []Spec{warm})
	if err == nil || !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "cannot start a python interpreter") {
		t.Fatalf("code=python on a provider that cannot warm one: %v", err)
	}
	bash, _ := ParseSpec("docker/img?code=bash")
	_, err = NewManager(map[string]roche.Provider{"docker": &warmingFake{fakeProvider: newFake(0)}}, []Spec{bash})
	if err == nil || !strings.Contains(err.Error(), "cannot start a bash interpreter") {
		t.Fatalf("code=bash on a provider serving python only: %v", err)
	}
}

// warmingFake is a fake whose sandboxes run python and can warm it (kit.CodeWarmer);
// warming fails with err.
type warmingFake struct {
	*fakeProvider
	err    error
	warmed atomic.Int32
}

func (w *warmingFake) Capabilities() roche.Capabilities {
	return roche.Capabilities{Code: []string{roche.LanguagePython}}
}

func (w *warmingFake) WarmCode(_ context.Context, id, language string) error {
	if w.err != nil {
		return w.err
	}
	w.warmed.Add(1)
	return nil
}

// TestWarmCode: a pool with code=python warms each sandbox before it is ready; one whose
// interpreter does not start is destroyed, and the pool reports why and backs off.
func TestWarmCode(t *testing.T) { synctest.Test(t, warmCode) }

func warmCode(t *testing.T) {
	w := &warmingFake{fakeProvider: newFake(0)}
	_, pl := newManager(t, w, "fake/img?min=2&code=python")
	if err := pl.Warmup(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if got := w.warmed.Load(); got != 2 {
		t.Fatalf("warmed %d sandboxes, want the 2 made", got)
	}

	bad := &warmingFake{fakeProvider: newFake(0), err: errors.New("no python3 in the image")}
	_, pl = newManager(t, bad, "fake/img?min=1&code=python")
	err := pl.Warmup(context.Background(), 0)
	if err == nil || !strings.Contains(err.Error(), "starting its python interpreter: no python3 in the image") {
		t.Fatalf("warmup with interpreters that do not start: %v", err)
	}
	waitFor(t, "the unwarmed sandbox destroyed", func() bool { live, _, _, created := bad.stats(); return live == 0 && created == 1 })
}

// TestDiskMatches: were pools ever to hold writable roots, a create asking for another
// disk limit must not be served one made with the pool's.
func TestDiskMatches(t *testing.T) {
	base := roche.DefaultConfig()
	for _, c := range []struct {
		name           string
		writable       bool
		disk, poolDisk string
		want           bool
	}{
		{"read-only, other disk", false, "100m", "1g", true},
		{"writable, same disk", true, "1g", "1g", true},
		{"writable, same disk spelled otherwise", true, "1024m", "1g", true},
		{"writable, other disk", true, "100m", "1g", false},
		{"writable, no limit against a limit", true, "0", "1g", false},
	} {
		cfg, pooled := base, base
		cfg.Writable, pooled.Writable = c.writable, c.writable
		cfg.Disk, pooled.Disk = c.disk, c.poolDisk
		if got := diskMatches(cfg, pooled); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestAcquireSkipsDead: idle sandboxes that died behind the pool's back (or hang) are
// found by the check before hand-out, destroyed and replaced; the next live one is
// handed out, and when none is left the create misses rather than get a dead one.
func TestAcquireSkipsDead(t *testing.T) { synctest.Test(t, acquireSkipsDead) }

func acquireSkipsDead(t *testing.T) {
	f := newFake(time.Millisecond)
	var mu sync.Mutex
	var destroyed []string
	m, p := newManager(t, f, "fake/img?min=3&max=3&idle_timeout=60", WithJanitorInterval(10*time.Millisecond),
		WithProbeTimeout(50*time.Millisecond),
		WithHooks(Hooks{Destroyed: func(_ Key, id string) {
			mu.Lock()
			destroyed = append(destroyed, id)
			mu.Unlock()
		}}))
	m.Start()
	waitFor(t, "three idle", func() bool { return p.Status().Idle == 3 })
	ids := p.IdleIDs()
	f.kill(ids[0])
	f.mu.Lock()
	f.hung[ids[1]] = true
	f.mu.Unlock()
	sb, ok := p.Acquire(context.Background())
	if !ok || sb.ID != ids[2] {
		t.Fatalf("acquired %q (%v), want the one live sandbox %s", sb.ID, ok, ids[2])
	}
	st := p.Status()
	if st.Dead != 2 || st.Hits != 1 || st.Misses != 0 {
		t.Fatalf("status %+v, want 2 dead, 1 hit, no miss", st)
	}
	waitFor(t, "the dead ones destroyed and replaced", func() bool {
		mu.Lock()
		n := len(destroyed)
		mu.Unlock()
		return n == 2 && p.Status().Idle == 3
	})
	for _, id := range ids[:2] {
		f.mu.Lock()
		live := f.live[id]
		f.mu.Unlock()
		if live {
			t.Errorf("dead sandbox %s was not destroyed", id)
		}
	}

	// Every idle one dead: a miss, never a dead sandbox.
	for _, id := range p.IdleIDs() {
		f.kill(id)
	}
	if sb, ok := p.Acquire(context.Background()); ok {
		t.Fatalf("acquired %s, which is dead", sb.ID)
	}
	if st := p.Status(); st.Dead != 5 || st.Misses != 1 {
		t.Fatalf("status %+v, want 5 dead and a miss", st)
	}
	waitFor(t, "the refill", func() bool { return p.Status().Idle == 3 })
	if _, ok := p.Acquire(context.Background()); !ok {
		t.Fatal("no hit after the refill")
	}
}

// TestAcquireCallerGone: a caller that gives up during the check leaves the sandbox in
// the pool: its giving up says nothing of the sandbox.
func TestAcquireCallerGone(t *testing.T) { synctest.Test(t, acquireCallerGone) }

func acquireCallerGone(t *testing.T) {
	f := newFake(time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=1&max=1&idle_timeout=60")
	m.Start()
	waitFor(t, "one idle", func() bool { return p.Status().Idle == 1 })
	id := p.IdleIDs()[0]
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if sb, ok := p.Acquire(ctx); ok {
		t.Fatalf("acquired %s for a caller that had gone", sb.ID)
	}
	if st := p.Status(); st.Idle != 1 || st.Dead != 0 || p.IdleIDs()[0] != id {
		t.Fatalf("status %+v, idle %v: want %s kept, none dead", st, p.IdleIDs(), id)
	}
}

// TestDiscardReplaces: an idle sandbox the owner reports dead (Discard) leaves the
// pool's counts at once and is replaced.
func TestDiscardReplaces(t *testing.T) { synctest.Test(t, discardReplaces) }

func discardReplaces(t *testing.T) {
	f := newFake(time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=2&max=2&idle_timeout=60")
	m.Start()
	waitFor(t, "two idle", func() bool { return p.Status().Idle == 2 })
	id := p.IdleIDs()[0]
	f.kill(id)
	if !p.Discard(id) {
		t.Fatalf("Discard of idle %s says it was not idle", id)
	}
	if p.Discard(id) || p.Discard("fake-none") {
		t.Fatal("Discard of a sandbox not idle here says it was")
	}
	if st := p.Status(); st.Dead != 1 || st.Idle+st.Creating != 2 {
		t.Fatalf("status %+v right after Discard: want 1 dead, its replacement on the way", st)
	}
	waitFor(t, "the replacement", func() bool { return p.Status().Idle == 2 })
	for _, idle := range p.IdleIDs() {
		if idle == id {
			t.Fatalf("the discarded sandbox %s is still idle", id)
		}
	}
}

// TestQueueServesAtTheEnginesRate: with a queue, creates that find the pool empty wait
// for its next sandboxes instead of each making one; they are served oldest first, as
// fast as the bounded creations make them, and past the queue a create is refused at
// once.
func TestQueueServesAtTheEnginesRate(t *testing.T) { synctest.Test(t, queueServesAtTheEnginesRate) }

func queueServesAtTheEnginesRate(t *testing.T) {
	f := newFake(30 * time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=0&max=0&queue=4", WithConcurrency(2))
	m.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	got := make(chan string, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, ok, err := p.Wait(ctx)
			if err != nil || !ok {
				t.Errorf("wait: ok %v, err %v", ok, err)
				return
			}
			got <- sb.ID
		}()
	}
	waitFor(t, "four creates waiting", func() bool { return p.Status().Waiting+len(got) >= 4 })
	// The queue is full while they wait: a fifth is refused at once.
	if p.Status().Waiting == 4 {
		start := time.Now()
		_, _, err := p.Wait(ctx)
		if !errors.Is(err, roche.ErrExhausted) || time.Since(start) > time.Second {
			t.Fatalf("wait past the queue: %v after %s, want ErrExhausted at once", err, time.Since(start))
		}
		if !strings.Contains(err.Error(), "queue") {
			t.Errorf("refusal %q does not name the queue", err)
		}
		if after, ok := roche.RetryDelay(err); !ok || after <= 0 || !strings.Contains(err.Error(), "retry in "+after.String()) {
			t.Errorf("refusal %q says when to retry: %v %v, want a positive wait, named in the message", err, after, ok)
		}
	}
	wg.Wait()
	close(got)
	ids := map[string]bool{}
	for id := range got {
		ids[id] = true
	}
	_, _, maxCreate, created := f.stats()
	if len(ids) != 4 || created != 4 || maxCreate > 2 {
		t.Fatalf("served %d distinct sandboxes, %d created, %d at once; want 4, 4, at most 2", len(ids), created, maxCreate)
	}
	if st := p.Status(); st.Waiting != 0 || st.InUse != 4 || st.Idle != 0 {
		t.Fatalf("status %+v, want nothing waiting, 4 in use, none idle", st)
	}
	for id := range ids {
		p.Forget(id)
		_ = f.Destroy(context.Background(), id)
	}
}

// TestQueueWaitEndsAtDeadline: a create waits no longer than its deadline, says so,
// and the sandbox made for it is not lost but kept idle for the next.
func TestQueueWaitEndsAtDeadline(t *testing.T) { synctest.Test(t, queueWaitEndsAtDeadline) }

func queueWaitEndsAtDeadline(t *testing.T) {
	f := newFake(300 * time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=0&max=1&queue=2")
	m.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, ok, err := p.Wait(ctx)
	if ok || !errors.Is(err, roche.ErrTimeout) {
		t.Fatalf("wait past the deadline: ok %v, err %v; want ErrTimeout", ok, err)
	}
	waitFor(t, "the sandbox made for it to be kept idle", func() bool { return p.Status().Idle == 1 })
	if st := p.Status(); st.Waiting != 0 {
		t.Fatalf("status %+v, want nothing waiting", st)
	}
}

// TestQueueHearsCreateFailure: a create waiting hears why the pool could not make its
// sandbox at once, not at its deadline; a pool without a queue never holds a create.
func TestQueueHearsCreateFailure(t *testing.T) { synctest.Test(t, queueHearsCreateFailure) }

func queueHearsCreateFailure(t *testing.T) {
	f := newFake(10 * time.Millisecond)
	f.fail.Store(1)
	m, p := newManager(t, f, "fake/img?min=0&max=0&queue=2")
	m.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, ok, err := p.Wait(ctx)
	if ok || !errors.Is(err, roche.ErrUnavailable) || time.Since(start) > 5*time.Second {
		t.Fatalf("wait on a failing create: ok %v, err %v after %s; want ErrUnavailable soon", ok, err, time.Since(start))
	}

	_, q := newManager(t, newFake(0), "fake/img?min=0&max=0")
	if _, ok, err := q.Wait(ctx); ok || err != nil {
		t.Fatalf("wait on a pool without a queue: ok %v, err %v; want a miss", ok, err)
	}
}

// TestDepthFollowsDemand: a burst of creates raises the idle sandboxes kept (within
// max), and they fall back to min when the demand stops.
func TestDepthFollowsDemand(t *testing.T) { synctest.Test(t, depthFollowsDemand) }

func depthFollowsDemand(t *testing.T) {
	f := newFake(100 * time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=1&max=6&idle_timeout=60", WithJanitorInterval(10*time.Millisecond))
	m.Start()
	waitFor(t, "one idle", func() bool { return p.Status().Idle == 1 })
	if st := p.Status(); st.Target != 1 {
		t.Fatalf("target %d before any demand, want min 1", st.Target)
	}
	// 40 creates in about 2 s: 4 a second, each sandbox 100 ms to make.
	var taken []string
	for range 40 {
		if sb, ok := p.Acquire(context.Background()); ok {
			taken = append(taken, sb.ID)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st := p.Status()
	if st.Target < 2 || st.Target > 6 {
		t.Fatalf("target %d after 40 creates in 2 s (100 ms each to make), want 2..6", st.Target)
	}
	waitFor(t, "idle to reach the target", func() bool { s := p.Status(); return s.Idle >= s.Target })
	for _, id := range taken {
		p.Forget(id)
		_ = f.Destroy(context.Background(), id)
	}
	// The demand ages out of its window.
	p.mu.Lock()
	for i := range p.demand.asks {
		p.demand.asks[i] = p.demand.asks[i].Add(-time.Minute)
	}
	p.mu.Unlock()
	if st := p.Status(); st.Target != 1 {
		t.Fatalf("target %d once the demand stopped, want min 1", st.Target)
	}
}

// TestQueueRefusesAnExpectedWaitPastItsBound: a create that would wait longer than the
// pool's wait (or its own deadline), at the rate the pool makes sandboxes, is refused at
// once rather than queued.
func TestQueueRefusesAnExpectedWaitPastItsBound(t *testing.T) {
	synctest.Test(t, queueRefusesAnExpectedWaitPastItsBound)
}

func queueRefusesAnExpectedWaitPastItsBound(t *testing.T) {
	f := newFake(200 * time.Millisecond)
	m, p := newManager(t, f, "fake/img?min=1&max=1&queue=10&wait=0.3", WithConcurrency(1))
	m.Start()
	waitFor(t, "one idle (the pool has timed a creation)", func() bool { return p.Status().Idle == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sb, ok := p.Acquire(ctx)
	if !ok {
		t.Fatal("no hit")
	}
	defer p.Forget(sb.ID)
	// One sandbox takes ~200 ms: the first create waiting expects ~200 ms, within 300 ms.
	first := make(chan error, 1)
	go func() {
		sb, _, err := p.Wait(ctx)
		if err == nil {
			p.Forget(sb.ID)
		}
		first <- err
	}()
	waitFor(t, "one create waiting", func() bool { return p.Status().Waiting == 1 })
	// The second would wait ~400 ms, past 300 ms: refused at once, saying why.
	start := time.Now()
	_, _, err := p.Wait(ctx)
	if !errors.Is(err, roche.ErrExhausted) || time.Since(start) > 100*time.Millisecond || !strings.Contains(err.Error(), "would make this create wait") {
		t.Fatalf("second wait: %v after %s; want ErrExhausted at once, saying the wait", err, time.Since(start))
	}
	// The hint is the time the queue it found takes to be served: ~400 ms.
	if after, ok := roche.RetryDelay(err); !ok || after < 300*time.Millisecond || after > 2*time.Second {
		t.Errorf("the refusal's retry hint: %v %v, want about 400 ms", after, ok)
	}
	// A deadline shorter than one creation is refused at once too.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, _, err := p.Wait(short); !errors.Is(err, roche.ErrExhausted) {
		t.Fatalf("wait with a 50 ms deadline: %v, want ErrExhausted", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first wait: %v", err)
	}
}

// TestExpectedWaitFollowsTheServeRate: on a saturated host the pool serves its queue
// more slowly than its creations' durations over its concurrency suggest; a queued
// create expects the rate it has lately been served at, and only while that is recent.
// Without it, a create expects the creations before it made one at a time.
func TestExpectedWaitFollowsTheServeRate(t *testing.T) {
	now := time.Now()
	d := demand{make: 100 * time.Millisecond}
	if got := d.wait(now, 3, 4); got != 400*time.Millisecond {
		t.Fatalf("no queue served lately: wait %v, want four creations one at a time (400ms)", got)
	}
	if got := d.interval(now); got != 100*time.Millisecond {
		t.Fatalf("no queue served lately: interval %v, want one creation (100ms)", got)
	}
	// Four served over the last 2 s: one every 500 ms, so 4 creates (3 waiting and this
	// one) expect 2 s, not the 100 ms four at once would take.
	for _, ago := range []time.Duration{2000, 1500, 1000, 500} {
		d.served = append(d.served, now.Add(-ago*time.Millisecond))
	}
	if got := d.wait(now, 3, 4); got != 2*time.Second {
		t.Fatalf("queue served every 500 ms: wait %v, want 2s", got)
	}
	if got := d.interval(now); got != 500*time.Millisecond {
		t.Fatalf("queue served every 500 ms: interval %v, want 500ms", got)
	}
	// Past serveWindow the rate is forgotten.
	if got := d.wait(now.Add(serveWindow+time.Second), 3, 4); got != 400*time.Millisecond {
		t.Fatalf("after the window: wait %v, want 400ms", got)
	}
	// Served faster than conc at once can make them (sandboxes already under way when the
	// queue formed): no less than the creations' durations at conc at once.
	d.served = nil
	for _, ago := range []time.Duration{30, 20, 10} {
		d.served = append(d.served, now.Add(-ago*time.Millisecond))
	}
	if got := d.wait(now, 3, 4); got != 100*time.Millisecond {
		t.Fatalf("queue served every 10 ms: wait %v, want one creation (100ms)", got)
	}
}
