package ledger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/kit"
)

// leasingProvider makes sandboxes that are map entries, leased as a pool's are, and
// holds the first Keep (the lease of a pooled sandbox ended as it is handed out) until
// release is closed: a claim caught between its record and the end of its create.
type leasingProvider struct {
	kept    chan struct{} // closed when the first Keep has begun
	release chan struct{}
	once    sync.Once

	mu   sync.Mutex
	next int
	live map[string]roche.SandboxInfo
}

var (
	_ kit.Creator = (*leasingProvider)(nil)
	_ kit.Leaser  = (*leasingProvider)(nil)
	_ kit.Prober  = (*leasingProvider)(nil)
)

func newLeasingProvider() *leasingProvider {
	return &leasingProvider{kept: make(chan struct{}), release: make(chan struct{}), live: map[string]roche.SandboxInfo{}}
}

func (f *leasingProvider) Name() string { return "fake" }
func (f *leasingProvider) Capabilities() roche.Capabilities {
	return roche.Capabilities{Leases: true}
}

func (f *leasingProvider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return f.CreateFor(ctx, cfg, kit.CreateOptions{})
}

func (f *leasingProvider) CreateFor(_ context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	now := time.Now()
	sb := roche.SandboxInfo{ID: fmt.Sprintf("fake-%d", f.next), Provider: "fake", Image: cfg.Image, State: roche.StateRunning,
		Owner: opts.Owner, CreatedAt: now, ExpiresAt: now.Add(time.Duration(cfg.TimeoutSecs) * time.Second)}
	f.live[sb.ID] = sb
	return sb, nil
}

func (f *leasingProvider) Keep(ctx context.Context, _ string) error {
	first := false
	f.once.Do(func() { first = true; close(f.kept) })
	if !first {
		return nil
	}
	select {
	case <-f.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *leasingProvider) Probe(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.live[id]; !ok {
		return fmt.Errorf("%w: no sandbox %s", roche.ErrNotFound, id)
	}
	return nil
}

func (f *leasingProvider) Exec(context.Context, string, roche.ExecRequest) (roche.ExecResult, error) {
	return roche.ExecResult{}, nil
}

func (f *leasingProvider) Destroy(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, id)
	return nil
}

func (f *leasingProvider) Inspect(_ context.Context, id string) (roche.SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.live[id]; ok {
		return sb, nil
	}
	return roche.SandboxInfo{}, roche.ErrNotFound
}

func (f *leasingProvider) List(context.Context) ([]roche.SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := make([]roche.SandboxInfo, 0, len(f.live))
	for _, sb := range f.live {
		list = append(list, sb)
	}
	return list, nil
}

// TestAdmitCountsAClaimOnce: a create served from a pool counts once against
// MaxSandboxes, also while it is still being handed out (its record made, its lease
// still being ended): a pool of MaxSandboxes claimed at once serves every claim. A
// claim counted both as its record and as its create's reservation refused the last
// claim of internal/k8sscale's TestScale under load, at "the limit of 50" with 49 given.
func TestAdmitCountsAClaimOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fp := newLeasingProvider()
	spec, err := pool.ParseSpec("fake/img?min=2&max=2&total=2")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Config{DefaultProvider: "fake", StateFile: filepath.Join(t.TempDir(), "state.json"), MaxSandboxes: 2, Pools: []pool.Spec{spec}},
		map[string]roche.Provider{"fake": fp})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if err := l.Pools()[0].Warmup(ctx, 2); err != nil {
		t.Fatal(err)
	}
	local := &Tenant{Name: LocalTenant, Local: true}
	cfg := roche.DefaultConfig()
	cfg.Image = "img"
	create := func() (roche.SandboxInfo, bool, error) { return l.Create(ctx, local, "fake", cfg, false) }

	type answer struct {
		pooled bool
		err    error
	}
	first := make(chan answer, 1)
	go func() {
		_, pooled, err := create()
		first <- answer{pooled, err}
	}()
	select {
	case <-fp.kept: // the first claim is being handed out
	case a := <-first:
		t.Fatalf("the first claim ended before its lease was ended: pooled %v, %v", a.pooled, a.err)
	}
	// /metrics counts it once too: creating (its reservation), not also running.
	if c := l.Counts(); c["running"]+c["creating"] != 1 {
		t.Errorf("counts while one claim is handed out: %v, want running and creating 1 together", c)
	}
	_, pooled, err := create()
	close(fp.release)
	a := <-first
	if err != nil || !pooled {
		t.Errorf("the second of 2 claims at --max-sandboxes 2, while the first was handed out: pooled %v, %v; want a pooled sandbox", pooled, err)
	}
	if a.err != nil || !a.pooled {
		t.Errorf("the first claim: pooled %v, %v; want a pooled sandbox", a.pooled, a.err)
	}
	// Both count now: a third create is over the limit.
	if _, _, err := create(); !errors.Is(err, roche.ErrExhausted) {
		t.Errorf("a third create at --max-sandboxes 2: %v, want roched's limit", err)
	}
}
