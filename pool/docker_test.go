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
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
)

func testImage() string {
	if img := os.Getenv("ROCHE_TEST_IMAGE"); img != "" {
		return img
	}
	return "roche/python:local"
}

// TestDockerPool runs a pool against the real engine: it fills, hands out distinct
// running sandboxes, refills within its total, and Close leaves only what was handed out.
func TestDockerPool(t *testing.T) {
	p, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("%v (the README's test command starts dockerd and builds the image)", err)
	}

	var mu sync.Mutex
	var created []string
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=2&max=2&total=3&idle_timeout=60")
	if err != nil {
		t.Fatal(err)
	}
	m, err := pool.NewManager(map[string]roche.Provider{"docker": p}, []pool.Spec{spec},
		pool.WithHooks(pool.Hooks{Created: func(_ pool.Key, sb roche.SandboxInfo) {
			mu.Lock()
			created = append(created, sb.ID)
			mu.Unlock()
		}}))
	if err != nil {
		t.Fatal(err)
	}
	var handedOut []string
	defer func() {
		if _, err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
		for _, id := range handedOut {
			_ = p.Destroy(context.Background(), id)
		}
		// Every sandbox the pool ever made is gone.
		mu.Lock()
		defer mu.Unlock()
		for _, id := range created {
			if _, err := p.Inspect(context.Background(), id); err == nil {
				t.Errorf("pooled sandbox %s survived Close", id)
				_ = p.Destroy(context.Background(), id)
			}
		}
	}()
	m.Start()
	pl := m.Pools()[0]
	if err := pl.Warmup(ctx, 0); err != nil {
		t.Fatal(err)
	}
	a, okA := pl.Acquire(context.Background())
	b, okB := pl.Acquire(context.Background())
	if !okA || !okB || a.ID == b.ID {
		t.Fatalf("acquire: %v %v %s %s", okA, okB, a.ID, b.ID)
	}
	handedOut = append(handedOut, a.ID, b.ID)
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
	mu.Lock()
	n := len(created)
	mu.Unlock()
	if st := pl.Status(); st.Idle != 1 || n != 3 {
		t.Fatalf("after refill within total 3: %+v, %d created", st, n)
	}
}

// TestDockerPoolSkipsDead: an idle pooled sandbox whose container was killed behind the
// pool's back (docker kill of that container, by id) is never handed out: the check
// before hand-out finds it dead, and the next one, which runs commands, is given instead.
func TestDockerPoolSkipsDead(t *testing.T) {
	p, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()

	var mu sync.Mutex
	var created []string
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=2&max=2&idle_timeout=60")
	if err != nil {
		t.Fatal(err)
	}
	m, err := pool.NewManager(map[string]roche.Provider{"docker": p}, []pool.Spec{spec},
		pool.WithHooks(pool.Hooks{Created: func(_ pool.Key, sb roche.SandboxInfo) {
			mu.Lock()
			created = append(created, sb.ID)
			mu.Unlock()
		}}))
	if err != nil {
		t.Fatal(err)
	}
	var handedOut []string
	defer func() {
		if _, err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
		for _, id := range handedOut {
			_ = p.Destroy(context.Background(), id)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, id := range created {
			if _, err := p.Inspect(context.Background(), id); err == nil {
				t.Errorf("pooled sandbox %s survived", id)
				_ = p.Destroy(context.Background(), id)
			}
		}
	}()
	m.Start()
	pl := m.Pools()[0]
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
	handedOut = append(handedOut, sb.ID)
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
	p, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=1&code=python")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var created []string
	m, err := pool.NewManager(map[string]roche.Provider{"docker": p}, []pool.Spec{spec},
		pool.WithHooks(pool.Hooks{Created: func(_ pool.Key, sb roche.SandboxInfo) {
			mu.Lock()
			created = append(created, sb.ID)
			mu.Unlock()
		}}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := m.Close(context.Background()); err != nil {
			t.Error(err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, id := range created {
			_ = p.Destroy(context.Background(), id)
		}
	}()
	m.Start()
	pl := m.Pools()[0]
	if err := pl.Warmup(ctx, 0); err != nil {
		t.Fatal(err)
	}
	sb, ok := pl.Acquire(ctx)
	if !ok {
		t.Fatal("no sandbox handed out")
	}
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
