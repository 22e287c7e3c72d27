package faults

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// controlBound is the deadline of a list, inspect, destroy or pause.
const controlBound = 10 * time.Second

// TestProviderAgainstSilentEngine: against a socket that accepts and never answers,
// every call of the Docker provider ends at its bound (a create at the engine timeout,
// the rest at 10 s) with one line naming the engine, which is ErrUnavailable.
func TestProviderAgainstSilentEngine(t *testing.T) {
	sock := silentSocket(t)
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	const createBound = 2 * time.Second
	p, err := docker.New(docker.WithEngineTimeout(createBound), docker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	const id = "0123456789ab"
	calls := []struct {
		name  string
		bound time.Duration
		call  func(context.Context) error
	}{
		{"create", createBound, func(ctx context.Context) error { _, err := p.Create(ctx, cfg); return err }},
		{"list", controlBound, func(ctx context.Context) error { _, err := p.List(ctx); return err }},
		{"inspect", controlBound, func(ctx context.Context) error { _, err := p.Inspect(ctx, id); return err }},
		{"destroy", controlBound, func(ctx context.Context) error { return p.Destroy(ctx, id) }},
		{"gc", controlBound, func(ctx context.Context) error { _, err := p.GC(ctx, roche.GCOptions{}); return err }},
		{"pause", controlBound, func(ctx context.Context) error { return p.Pause(ctx, id) }},
		{"exec", controlBound, func(ctx context.Context) error {
			_, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"true"}})
			return err
		}},
		{"ping", controlBound, p.Ping},
	}
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			within(t, c.name, c.bound, func() { err = c.call(context.Background()) })
			if !errors.Is(err, roche.ErrUnavailable) {
				t.Errorf("%s: %v, want ErrUnavailable", c.name, err)
			}
			notAnswering(t, c.name, err, "unix://"+sock)
		}()
	}
	wg.Wait()
}

// TestCreateUndoneWhenTheEngineStopsAnswering: the engine does the work but its answer
// never comes back, once for the container's creation and once for its start. Create
// fails at its bound, naming the engine, and the container the engine made is removed:
// nothing is left.
func TestCreateUndoneWhenTheEngineStopsAnswering(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	proxy := newEngineProxy(t)
	t.Setenv("DOCKER_HOST", "unix://"+proxy.socket)
	const createBound = 6 * time.Second
	logger, log := testLog(t)
	p, err := docker.New(docker.WithEngineTimeout(createBound), docker.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = img
	// Only for the steps that hang: a create here can take seconds on a loaded machine.
	removed := 0
	for _, step := range []struct {
		name string
		rule func(r *http.Request) bool
	}{
		{"creation", isCreate},
		{"start", isStart},
	} {
		t.Run(step.name, func(t *testing.T) {
			proxy.set(false, nil, step.rule)
			var err error
			within(t, "create", createBound, func() { _, err = p.Create(context.Background(), cfg) })
			proxy.set(false, nil, nil)
			notAnswering(t, "create", err, "unix://"+proxy.socket)
			// The engine made the container after Create gave up; it is removed in the
			// background as soon as the engine answers.
			noneLeft(t, real, img, 30*time.Second)
			if n := strings.Count(log.String(), "removed a sandbox a create left half-made"); n != removed+1 {
				t.Errorf("the half-made sandbox was not removed by the provider (%d removals logged)", n)
			}
			removed++
		})
	}
}

// TestFrozenDockerd freezes a dockerd (SIGSTOP) for a few seconds and checks, all at
// once so the window stays short: a create ends at the engine timeout, list and destroy
// at 10 s, each naming the engine; a command through roche-agent still runs (it needs no
// engine); the direct CLI's list ends at its bound; roched reports the engine down on
// /healthz and in metrics and refuses creates at once. After dockerd continues,
// everything works again and nothing was left. The dockerd is a private one: the shared
// engine frozen for 10 s fails whatever else uses it meanwhile (make test's other stream
// saw its destroys time out, and their sandboxes lived on to the end of their lifetime).
func TestFrozenDockerd(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	pd := startPrivateDockerd(t)
	real, err := docker.New(docker.WithClient(pd.client(t)), docker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	// The engine is this test's own, so its image is too.
	img := testenv.Image()
	// Long enough for a create on a loaded machine (the one made before the freeze).
	const createBound = 8 * time.Second
	p, err := docker.New(docker.WithClient(pd.client(t)), docker.WithEngineTimeout(createBound), docker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = img
	ctx := context.Background()
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, sb.ID)
	rd := startRoched(t, pd.host, 300*time.Millisecond)
	if _, err := rd.provider.Create(ctx, cfg); err != nil { // warm: the roched works
		t.Fatal(err)
	}

	thaw := freezeDockerd(t, pd.pid(), 40*time.Second)
	var wg sync.WaitGroup
	run := func(name string, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	run("create", func() {
		var err error
		within(t, "create", createBound, func() { _, err = p.Create(ctx, cfg) })
		notAnswering(t, "create", err, pd.host)
	})
	run("list", func() {
		var err error
		var list []roche.SandboxInfo
		el := within(t, "list", controlBound, func() { list, err = p.List(ctx) })
		t.Logf("list: %d sandboxes, %v after %v", len(list), err, el)
		notAnswering(t, "list", err, pd.host)
	})
	run("destroy", func() {
		// A fresh provider has not cached the sandbox, so it must ask the engine.
		q, err := docker.New(docker.WithClient(pd.client(t)), docker.WithLogger(testLogger(t)))
		if err != nil {
			t.Error(err)
			return
		}
		defer q.Close()
		within(t, "destroy", controlBound, func() { err = q.Destroy(ctx, sb.ID) })
		notAnswering(t, "destroy", err, pd.host)
	})
	run("exec through the agent", func() {
		res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"echo", "still here"}, Timeout: 10 * time.Second})
		if err != nil || res.Stdout != "still here\n" {
			t.Errorf("exec through roche-agent with dockerd frozen: %+v %v", res, err)
		}
	})
	run("cli list", func() {
		r := runRoche(t, append(noDaemon(t), "DOCKER_HOST="+pd.host), "--direct", "list", "--provider", "docker")
		if r.code != 1 || r.took > controlBound+margin || strLines(r.stderr) != 1 {
			t.Errorf("roche list with dockerd frozen: %+v", r)
		}
		notAnswering(t, "roche list", errors.New(strings.TrimSpace(r.stderr)), pd.host)
	})
	run("roched", func() { rd.assertDown(t, pd.host) })
	wg.Wait()
	thaw()

	rd.assertUp(t)
	if err := p.Destroy(ctx, sb.ID); err != nil {
		t.Fatalf("destroy after dockerd continued: %v", err)
	}
	rd.destroyAll(t)
	noneLeft(t, real, img, 30*time.Second)
}
