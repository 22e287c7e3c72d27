package daemon

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/wasm"
)

// startRochedEnv runs the test binary as roched, as startRoched does, with extra
// environment: each test gets a runtime directory of its own, so the wasm provider's
// sandboxes (kept under it) are the test's alone.
func startRochedEnv(t *testing.T, socket string, env []string, args ...string) *roched {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"--socket", socket, "--log-level", "debug"}, args...)...)
	cmd.Env = append(append(os.Environ(), "ROCHED_TEST_AS_DAEMON=1"), env...)
	r := &roched{cmd: cmd, log: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	r.listening(t, socket)
	return r
}

// stopRoched stops roched gracefully and waits for it.
func stopRoched(t *testing.T, r *roched) {
	t.Helper()
	r.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("roched exited with %v\n%s", err, r.log)
		}
	case <-time.After(time.Minute):
		r.cmd.Process.Kill()
		<-done
		t.Fatalf("roched did not stop within a minute after SIGTERM\n%s", r.log)
	}
}

// wasmSandboxes lists the sandbox directories in a wasm state directory.
func wasmSandboxes(t *testing.T, stateDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(stateDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "wasm-") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// TestRochedServesWasm runs roched as its command line does, with a wasm pool: creates
// matching the pool are served from it, others are made cold, both run Python, and a
// graceful stop leaves no wasm sandbox behind.
func TestRochedServesWasm(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm, testenv.Docker)
	dir := shortDir(t)
	runtimeDir := filepath.Join(dir, "run")
	socket := filepath.Join(dir, "r.sock")
	r := startRochedEnv(t, socket, []string{"XDG_RUNTIME_DIR=" + runtimeDir},
		"--pool", "wasm/python:3.12?min=2&max=5")
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxFor(t, 2*time.Minute)

	h, err := c.Health(ctx)
	// Which others it serves depends on the machine (kubernetes where a kubeconfig is
	// set); docker and wasm it must.
	if err != nil || !slices.Contains(h.Providers, "docker") || !slices.Contains(h.Providers, "wasm") {
		t.Fatalf("providers: %+v %v", h, err)
	}
	eventually(t, time.Minute, "the wasm pool to fill", func() bool {
		st, err := c.PoolStatus(ctx)
		return err == nil && len(st) == 1 && st[0].Key == "wasm/python:3.12" && st[0].Idle == 2
	})

	p := c.Provider("wasm")
	cfg := roche.DefaultConfig()
	cfg.Image = "python:3.12"
	cfg.Env = map[string]string{"GREETING": "hi"}
	sb, pooled, err := c.Create(ctx, "wasm", cfg)
	if err != nil || !pooled || !strings.HasPrefix(sb.ID, "wasm-") {
		t.Fatalf("create matching the pool: %+v pooled=%v %v\n%s", sb, pooled, err, r.log)
	}
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "import os; print(os.environ['GREETING'])"}})
	if err != nil || res.ExitCode != 0 || res.Stdout != "hi\n" {
		t.Fatalf("exec in a pooled wasm sandbox: %+v %v", res, err)
	}
	if err := p.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// Another image spelling of CPython 3.12 is not the pool's: it is made for the create.
	cold, pooled, err := c.Create(ctx, "wasm", roche.DefaultConfig())
	if err != nil || pooled {
		t.Fatalf("cold wasm create: %+v pooled=%v %v", cold, pooled, err)
	}
	res, err = p.Exec(ctx, cold.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(6 * 7)"}})
	if err != nil || res.Stdout != "42\n" {
		t.Fatalf("exec in a cold wasm sandbox: %+v %v", res, err)
	}
	if err := p.Destroy(ctx, cold.ID); err != nil {
		t.Fatal(err)
	}

	stopRoched(t, r)
	if left := wasmSandboxes(t, filepath.Join(runtimeDir, "roche", "wasm")); len(left) > 0 {
		t.Fatalf("wasm sandboxes left after roched stopped: %v\n%s", left, r.log)
	}
}

// TestRochedWithoutPythonWasm: with python.wasm missing roched still starts and serves
// Docker, says in its log why wasm is unavailable, and a wasm create fails with
// UNAVAILABLE naming the script that fetches python.wasm.
func TestRochedWithoutPythonWasm(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := shortDir(t)
	socket := filepath.Join(dir, "r.sock")
	r := startRochedEnv(t, socket, []string{
		"XDG_RUNTIME_DIR=" + filepath.Join(dir, "run"),
		"XDG_CACHE_HOME=" + filepath.Join(dir, "cache"),
		wasm.PythonEnv + "=",
	}, "--pool", "wasm/python:3.12?min=1")
	if log := r.log.String(); !strings.Contains(log, "wasm provider unavailable") || !strings.Contains(log, wasm.FetchHint) {
		t.Fatalf("roched's log does not say why wasm is unavailable:\n%s", log)
	}
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxFor(t, 2*time.Minute)

	_, _, err = c.Create(ctx, "wasm", roche.DefaultConfig())
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), wasm.FetchHint) {
		t.Fatalf("wasm create without python.wasm: %v, want ErrUnavailable naming %s", err, wasm.FetchHint)
	}
	sb, _, err := c.Create(ctx, "docker", pyConfig())
	if err != nil {
		t.Fatalf("docker create with wasm unavailable: %v\n%s", err, r.log)
	}
	res, err := c.Provider("docker").Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('docker')"}})
	if err != nil || res.Stdout != "docker\n" {
		t.Fatalf("docker exec: %+v %v", res, err)
	}
	if err := c.Provider("docker").Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	stopRoched(t, r)
}

// TestWasmPoolServedWarm runs the daemon in-process with the wasm provider as roched
// builds it, and checks that a pooled sandbox's first exec runs on the interpreter the
// pool had started for it.
func TestWasmPoolServedWarm(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	dir := shortDir(t)
	wp, err := wasm.New(wasm.WithStateDir(filepath.Join(dir, "wasm")), wasm.WithWarmStart())
	if err != nil {
		t.Fatal(err)
	}
	defer wp.Close()
	if err := wp.Available(); err != nil {
		t.Fatal(err)
	}
	spec, err := pool.ParseSpec("wasm/python:3.12?min=2&max=2")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Socket: filepath.Join(dir, "r.sock"), Pools: []pool.Spec{spec}},
		map[string]roche.Provider{"wasm": wp}, WithPoolOptions(pool.WithJanitorInterval(100*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 2*time.Minute)
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		if left := wasmSandboxes(t, filepath.Join(dir, "wasm")); len(left) > 0 {
			t.Errorf("wasm sandboxes left after shutdown: %v", left)
		}
	}()
	c, err := client.New(client.WithSocket(d.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eventually(t, time.Minute, "two warm interpreters in the pool", func() bool {
		return wp.WarmStats().Ready == 2
	})

	cfg := roche.DefaultConfig()
	cfg.Image = "python:3.12"
	for i := range 3 {
		sb, pooled, err := c.Create(ctx, "", cfg) // the only provider served is the default
		if err != nil || !pooled {
			t.Fatalf("create %d: pooled=%v %v", i, pooled, err)
		}
		before := wp.WarmStats().Served
		start := time.Now()
		res, err := c.Provider("wasm").Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "import sys; print('hi', sys.argv)", "x"}})
		took := time.Since(start)
		if err != nil || res.Stdout != "hi ['-c', 'x']\n" {
			t.Fatalf("exec %d: %+v %v", i, res, err)
		}
		if wp.WarmStats().Served != before+1 {
			t.Fatalf("exec %d in a pooled sandbox did not run on its warm interpreter", i)
		}
		t.Logf("exec %d on a pooled sandbox's warm interpreter took %v", i, took)
		if err := c.Provider("wasm").Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the pool to refill with warm interpreters", func() bool {
			st := wp.WarmStats()
			return st.Ready == 2 && st.Starting == 0
		})
	}

	// A workdir the files API can make is served from the pool, in each sandbox anew;
	// one on the read-only root goes cold, where the provider makes it.
	for _, w := range []struct {
		dir    string
		pooled bool
	}{{"/workspace/proj", true}, {"/workspace/proj", true}, {"/tmp/w", true}, {"/srv/app", false}, {"/srv/app", false}} {
		wcfg := cfg
		wcfg.Workdir = w.dir
		sb, pooled, err := c.Create(ctx, "wasm", wcfg)
		if err != nil || pooled != w.pooled {
			t.Fatalf("create with workdir %s: pooled=%v (want %v) %v", w.dir, pooled, w.pooled, err)
		}
		before := wp.WarmStats().Served
		res, err := c.Provider("wasm").Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "import os; print(os.getcwd())"}})
		if err != nil || res.Stdout != w.dir+"\n" {
			t.Fatalf("cwd with workdir %s: %+v %v", w.dir, res, err)
		}
		// A cold sandbox's interpreter was started at its create: it serves the exec too.
		if wp.WarmStats().Served != before+1 {
			t.Fatalf("exec with workdir %s did not run on a warm interpreter", w.dir)
		}
		if err := c.Provider("wasm").Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the pool to refill", func() bool { return wp.WarmStats().Ready == 2 })
	}
}

// TestRochedServesOnlyTheProvidersGiven: with --providers wasm, roched opens no other
// provider (no Docker engine is asked, so its health is not degraded by one that is
// down), a create that names none goes to wasm, and one that names docker is refused.
func TestRochedServesOnlyTheProvidersGiven(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	dir := shortDir(t)
	socket := filepath.Join(dir, "r.sock")
	r := startRochedEnv(t, socket, []string{"XDG_RUNTIME_DIR=" + filepath.Join(dir, "run"), "DOCKER_HOST=unix://" + filepath.Join(dir, "no-engine.sock")},
		"--providers", "wasm")
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxFor(t, time.Minute)
	h, err := c.Health(ctx)
	if err != nil || !slices.Equal(h.Providers, []string{"wasm"}) || h.Status != "ok" {
		t.Fatalf("health with --providers wasm: %+v %v", h, err)
	}
	sb, _, err := c.Create(ctx, "", roche.DefaultConfig())
	if err != nil || !strings.HasPrefix(sb.ID, "wasm-") {
		t.Fatalf("a create naming no provider: %+v %v", sb, err)
	}
	if err := c.Provider("wasm").Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Create(ctx, "docker", roche.DefaultConfig()); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "serves wasm") {
		t.Fatalf("a docker create on a wasm-only roched: %v, want INVALID_ARGUMENT naming what it serves", err)
	}
	stopRoched(t, r)
}
