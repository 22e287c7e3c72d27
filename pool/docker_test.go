package pool_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
)

func testImage() string {
	if img := os.Getenv("ROCHE_TEST_IMAGE"); img != "" {
		return img
	}
	return "roche/python:local"
}

// dockerPool is a pool of one spec on the real engine, through the docker provider.
type dockerPool struct {
	p  *docker.Provider
	pl *pool.Pool

	mu        sync.Mutex
	created   []string // every sandbox the pool made
	handedOut []string // those the test took out, destroyed at its end
	creating  int      // Create calls in flight on the engine
	most      int      // the most of them at once
}

// counted is the docker provider, with the pool's creates in flight counted (the pool
// creates through kit.Create, so CreateFor).
type counted struct {
	*docker.Provider
	d *dockerPool
}

func (c counted) CreateFor(ctx context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	c.d.mu.Lock()
	c.d.creating++
	c.d.most = max(c.d.most, c.d.creating)
	c.d.mu.Unlock()
	defer func() {
		c.d.mu.Lock()
		c.d.creating--
		c.d.mu.Unlock()
	}()
	return c.Provider.CreateFor(ctx, cfg, opts)
}

// startDockerPool starts a pool of spec (after "docker/IMAGE?"), with the manager's
// options opts. At the end of the test it closes the pool, destroys what was handed out,
// and fails if any sandbox the pool made survived.
func startDockerPool(t *testing.T, params string, opts ...pool.Option) *dockerPool {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	p, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("%v (the README's test command starts dockerd and builds the image)", err)
	}
	spec, err := pool.ParseSpec("docker/" + testImage() + "?" + params)
	if err != nil {
		t.Fatal(err)
	}
	d := &dockerPool{p: p}
	m, err := pool.NewManager(map[string]roche.Provider{"docker": counted{p, d}}, []pool.Spec{spec},
		append([]pool.Option{pool.WithHooks(pool.Hooks{Created: func(_ pool.Key, sb roche.SandboxInfo) {
			d.mu.Lock()
			d.created = append(d.created, sb.ID)
			d.mu.Unlock()
		}})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, id := range d.handedOut {
			_ = p.Destroy(context.Background(), id)
		}
		// Every sandbox the pool ever made is gone.
		for _, id := range d.created {
			if _, err := p.Inspect(context.Background(), id); err == nil {
				t.Errorf("pooled sandbox %s survived Close", id)
				_ = p.Destroy(context.Background(), id)
			}
		}
	})
	m.Start()
	d.pl = m.Pools()[0]
	return d
}

// handOut records sandboxes the test took out of the pool.
func (d *dockerPool) handOut(ids ...string) {
	d.mu.Lock()
	d.handedOut = append(d.handedOut, ids...)
	d.mu.Unlock()
}

// madeSoFar counts the sandboxes the pool has made.
func (d *dockerPool) madeSoFar() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.created)
}

// TestDockerPool runs a pool against the real engine: it fills, hands out distinct
// running sandboxes, refills within its total, and Close leaves only what was handed out.
func TestDockerPool(t *testing.T) {
	d := startDockerPool(t, "min=2&max=2&total=3&idle_timeout=60")
	p, pl := d.p, d.pl
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pl.Warmup(ctx, 0); err != nil {
		t.Fatal(err)
	}
	a, okA := pl.Acquire(context.Background())
	b, okB := pl.Acquire(context.Background())
	if !okA || !okB || a.ID == b.ID {
		t.Fatalf("acquire: %v %v %s %s", okA, okB, a.ID, b.ID)
	}
	d.handOut(a.ID, b.ID)
	res, err := p.Exec(ctx, a.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('pooled')"}})
	if err != nil || res.Stdout != "pooled\n" {
		t.Fatalf("exec in a pooled sandbox: %+v %v", res, err)
	}
	// Each pooled sandbox has a uid of its own, as a sandbox made on demand does.
	var uids []string
	for _, id := range []string{a.ID, b.ID} {
		res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"id", "-u"}})
		if err != nil || res.ExitCode != 0 || res.Stdout == "0\n" {
			t.Fatalf("uid of pooled sandbox %s: %+v %v", id, res, err)
		}
		uids = append(uids, res.Stdout)
	}
	if uids[0] == uids[1] {
		t.Fatalf("two pooled sandboxes share uid %s", uids[0])
	}
	// Two handed out of a total of 3: the refill makes exactly one more.
	deadline := time.Now().Add(30 * time.Second)
	for pl.Status().Idle != 1 || pl.Status().Creating != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("refill: %+v", pl.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if st, n := pl.Status(), d.madeSoFar(); st.Idle != 1 || n != 3 {
		t.Fatalf("after refill within total 3: %+v, %d created", st, n)
	}
}

// TestDockerPoolSkipsDead: an idle pooled sandbox whose container was killed behind the
// pool's back (docker kill of that container, by id) is never handed out: the check
// before hand-out finds it dead, and the next one, which runs commands, is given instead.
func TestDockerPoolSkipsDead(t *testing.T) {
	d := startDockerPool(t, "min=2&max=2&idle_timeout=60")
	p, pl := d.p, d.pl
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if err := pl.Warmup(ctx, 0); err != nil {
		t.Fatal(err)
	}
	ids := pl.IdleIDs()
	if err := dc.ContainerKill(ctx, ids[0], "KILL"); err != nil {
		t.Fatal(err)
	}
	sb, ok := pl.Acquire(ctx)
	if !ok {
		t.Fatal("no sandbox handed out, though one of the two is alive")
	}
	d.handOut(sb.ID)
	if sb.ID == ids[0] {
		t.Fatalf("the killed sandbox %s was handed out", sb.ID)
	}
	if st := pl.Status(); st.Dead != 1 {
		t.Errorf("status %+v, want 1 dead", st)
	}
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(1)"}})
	if err != nil || res.Stdout != "1\n" {
		t.Fatalf("exec in the sandbox handed out: %+v %v", res, err)
	}
}

// TestDockerPoolWarmsCode: a pool with code=python hands out sandboxes whose python
// interpreter was started while they were idle: the default context's first cell runs in
// it (its pid is below that of a command run after the hand-out), with the pool's limits
// and as the sandbox user, and a fresh namespace (no cell ran before).
func TestDockerPoolWarmsCode(t *testing.T) {
	d := startDockerPool(t, "min=1&code=python")
	p, pl := d.p, d.pl
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pl.Warmup(ctx, 0); err != nil {
		t.Fatal(err)
	}
	sb, ok := pl.Acquire(ctx)
	if !ok {
		t.Fatal("no sandbox handed out")
	}
	d.handOut(sb.ID)
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo $$"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	after, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
	ex, err := p.RunCode(ctx, sb.ID, roche.CodeRequest{Code: "import os\nprint(os.getpid(), os.getuid(), 'x' in globals())"})
	if err != nil || ex.Error != nil {
		t.Fatalf("first cell: %+v %v", ex, err)
	}
	var pid, uid int
	var seen string
	if _, err := fmt.Sscan(strings.Join(ex.Logs.Stdout, ""), &pid, &uid, &seen); err != nil || seen != "False" || ex.ExecutionCount != 1 {
		t.Fatalf("first cell printed %q (count %d): want pid, uid, False and count 1", ex.Logs.Stdout, ex.ExecutionCount)
	}
	if uid == 0 {
		t.Fatal("the warmed interpreter runs as root")
	}
	if after == 0 || pid >= after {
		t.Fatalf("the default context's interpreter is pid %d, a command run after the hand-out %d: it was not the warmed one", pid, after)
	}
}

// TestDockerPoolAdaptsConcurrency: on the real engine, a pool whose creations wait for a
// slot creates more sandboxes at once than the cores while the CPUs are idle, and no
// more than the cores while they are saturated. The CPU readings are given (the
// machine's own depend on whatever else runs); what the engine is asked is real.
func TestDockerPoolAdaptsConcurrency(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	for _, c := range []struct {
		name        string
		idle        float64
		least, most int
	}{
		{"idle CPUs", 0.9, pool.DefaultConcurrency() + 1, 4 * pool.DefaultConcurrency()},
		{"saturated CPUs", 0.01, 1, pool.DefaultConcurrency()},
	} {
		t.Run(c.name, func(t *testing.T) {
			idle := func() (float64, bool) { return c.idle, true }
			d := startDockerPool(t, "min=8&max=8&idle_timeout=60", pool.WithIdleSource(idle, 50*time.Millisecond))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := d.pl.Warmup(ctx, 0); err != nil {
				t.Fatal(err)
			}
			d.mu.Lock()
			most := d.most
			d.mu.Unlock()
			if most < c.least || most > c.most {
				t.Errorf("%d creations at once on the engine, want %d to %d", most, c.least, c.most)
			}
		})
	}
}
