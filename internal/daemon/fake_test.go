package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/kit"
)

// memProvider keeps sandboxes in memory. It stands in for a backend only where the real
// engine cannot be used: destroying every sandbox on a Docker engine shared with other
// tests running at the same time.
type memProvider struct {
	mu   sync.Mutex
	next int
	live map[string]roche.SandboxInfo
}

func (m *memProvider) Name() string                     { return "mem" }
func (m *memProvider) Capabilities() roche.Capabilities { return roche.Capabilities{} }

func (m *memProvider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return m.CreateFor(ctx, cfg, kit.CreateOptions{})
}

func (m *memProvider) CreateFor(_ context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	now := time.Now()
	sb := roche.SandboxInfo{ID: fmt.Sprintf("mem-%04d", m.next), Provider: "mem", Image: cfg.Image, State: roche.StateRunning,
		CreatedAt: now, ExpiresAt: now.Add(time.Duration(cfg.TimeoutSecs) * time.Second), Owner: opts.Owner}
	m.live[sb.ID] = sb
	return sb, nil
}

func (m *memProvider) Exec(_ context.Context, id string, _ roche.ExecRequest) (roche.ExecResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.live[id]; !ok {
		return roche.ExecResult{}, fmt.Errorf("%w: no sandbox %s", roche.ErrNotFound, id)
	}
	return roche.ExecResult{}, nil
}

func (m *memProvider) Destroy(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.live, id)
	return nil
}

func (m *memProvider) Inspect(_ context.Context, id string) (roche.SandboxInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb, ok := m.live[id]
	if !ok {
		return sb, fmt.Errorf("%w: no sandbox %s", roche.ErrNotFound, id)
	}
	return sb, nil
}

func (m *memProvider) List(context.Context) ([]roche.SandboxInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]roche.SandboxInfo, 0, len(m.live))
	for _, sb := range m.live {
		out = append(out, sb)
	}
	return out, nil
}

func (m *memProvider) ids() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id := range m.live {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// TestDestroyAllSparesThePool: destroying every sandbox takes the clients' sandboxes
// and leaves the pool's idle ones, which are nobody's; one removed behind the pool's back
// is noticed and replaced rather than handed out dead.
func TestDestroyAllSparesThePool(t *testing.T) {
	mp := &memProvider{live: map[string]roche.SandboxInfo{}}
	spec, _ := pool.ParseSpec("mem/img?min=1")
	socket := filepath.Join(shortDir(t), "roched.sock")
	d, err := New(Config{Socket: socket, Pools: []pool.Spec{spec}}, map[string]roche.Provider{"mem": mp},
		WithPoolOptions(pool.WithJanitorInterval(20*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, time.Minute)
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown(context.Background())
	c, _ := client.New(client.WithSocket(socket))
	defer c.Close()
	if _, err := c.PoolWarmup(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	idle := mp.ids()
	cfg := roche.DefaultConfig()
	cfg.Image = "other"
	a, err := c.Provider("mem").Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Provider("mem")
	if _, err := p.GC(ctx, roche.GCOptions{All: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the client's sandbox to go", func() bool { return !slices.Contains(mp.ids(), a.ID) })
	if !slices.Contains(mp.ids(), idle[0]) {
		t.Fatal("gc --all destroyed an idle pool sandbox")
	}

	// Removed behind the pool's back, then noticed after the next destroy-all.
	mp.Destroy(ctx, idle[0])
	if _, err := c.Provider("mem").List(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DestroyAll(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a replacement", func() bool {
		ids := d.ledger.Pools()[0].IdleIDs()
		return len(ids) == 1 && ids[0] != idle[0]
	})
	sb, pooled, err := c.Create(ctx, "mem", roche.Config{Image: "img", TimeoutSecs: 10, Memory: "512m", Disk: "1g", CPUs: 1, PidsLimit: 64, User: roche.UserAuto})
	if err != nil || !pooled || sb.ID == idle[0] {
		t.Fatalf("create after the removal: %v %v %s", pooled, err, sb.ID)
	}
}

// TestSecondDaemonLeavesTheFirstAlone: a second roched on the same socket (and so the
// same state file) refuses to start before it reads the state, so it cannot mistake
// the running daemon's idle pool for a crashed daemon's leftovers.
func TestSecondDaemonLeavesTheFirstAlone(t *testing.T) {
	mp := &memProvider{live: map[string]roche.SandboxInfo{}}
	spec, _ := pool.ParseSpec("mem/img?min=1")
	socket := filepath.Join(shortDir(t), "roched.sock")
	cfg := Config{Socket: socket, Pools: []pool.Spec{spec}}
	providers := map[string]roche.Provider{"mem": mp}
	first, err := New(cfg, providers)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, time.Minute)
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer first.Shutdown(context.Background())
	if err := first.ledger.Pools()[0].Warmup(ctx, 0); err != nil {
		t.Fatal(err)
	}
	idle := mp.ids()
	state, err := os.ReadFile(first.cfg.StateFile)
	if err != nil || !strings.Contains(string(state), idle[0]) {
		t.Fatalf("state %s: %v", state, err)
	}

	second, err := New(cfg, providers)
	if err != nil {
		t.Fatal(err)
	}
	err = second.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "another roched already listens on "+socket) {
		t.Fatalf("second start: %v", err)
	}
	// Shutdown returns once the second's goroutines and its ledger's close have ended:
	// whatever it would have done to the first's sandboxes, it has done.
	second.Shutdown(context.Background())
	if got := mp.ids(); !slices.Equal(got, idle) {
		t.Fatalf("the first daemon's idle sandboxes %v became %v", idle, got)
	}
	if now, _ := os.ReadFile(first.cfg.StateFile); string(now) != string(state) {
		t.Fatalf("the second daemon rewrote the state file:\n%s\nwas\n%s", now, state)
	}
}
