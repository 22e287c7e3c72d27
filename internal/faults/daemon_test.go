package faults

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
)

// rochedUnderTest is a roched in this process whose Docker provider talks to the engine
// at host, with its log kept for the test to read.
type rochedUnderTest struct {
	d        *daemon.Daemon
	c        *client.Client
	provider *client.Provider
	log      *syncBuffer
	socket   string
	every    time.Duration
	stopped  bool
}

// startRoched starts roched with the given pools (pool.ParseSpec's form).
func startRoched(t *testing.T, host string, every time.Duration, pools ...string) *rochedUnderTest {
	t.Helper()
	var specs []pool.Spec
	for _, s := range pools {
		spec, err := pool.ParseSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, spec)
	}
	dc, err := dockerclient.NewClientWithOpts(dockerclient.WithHost(host), dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	log := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	dp, err := docker.New(docker.WithClient(dc), docker.WithLogger(logger), docker.WithEgressProxy())
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(shortDir(t), "roched.sock")
	d, err := daemon.New(daemon.Config{Socket: socket, EngineCheckInterval: every, Pools: specs},
		map[string]roche.Provider{"docker": dp}, daemon.WithLogger(logger))
	if err != nil {
		dp.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		dp.Close()
		t.Fatal(err)
	}
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	r := &rochedUnderTest{d: d, c: c, provider: c.Provider("docker"), log: log, socket: socket, every: every}
	t.Cleanup(func() {
		if !r.stopped {
			r.destroyAll(t)
			r.stop(t)
		}
		c.Close()
		dp.Close()
		if t.Failed() {
			t.Logf("roched log:\n%s", log.String())
		}
	})
	return r
}

// stop shuts roched down gracefully: the sandboxes clients hold are left running.
func (r *rochedUnderTest) stop(t *testing.T) {
	t.Helper()
	r.stopped = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.d.Shutdown(ctx); err != nil {
		t.Errorf("roched shutdown: %v", err)
	}
}

// destroyAll destroys every sandbox handed out by this roched.
func (r *rochedUnderTest) destroyAll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := r.c.DestroyAll(ctx, ""); err != nil {
		t.Errorf("destroying roched's sandboxes: %v", err)
	}
}

func (r *rochedUnderTest) health(t *testing.T) client.Health {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := r.c.Health(ctx)
	if err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	return h
}

// metric returns the line of /metrics that starts with prefix.
func (r *rochedUnderTest) metric(t *testing.T, prefix string) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", r.socket)
	}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://roched/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}

const engineUpMetric = `roche_engine_up{provider="docker"}`

// assertDown: within a check (and its 5 s deadline), roched reports the engine at addr
// down on /healthz and in its metrics, logs it, and refuses a create at once with
// UNAVAILABLE naming the engine.
func (r *rochedUnderTest) assertDown(t *testing.T, addr string) {
	t.Helper()
	eventually(t, r.every+5*time.Second+margin, "roched to report the engine down", func() bool {
		return r.health(t).Status == "degraded"
	})
	h := r.health(t)
	if eh := h.Engines["docker"]; eh.Up || !strings.Contains(eh.Error, "is not answering") {
		t.Errorf("/healthz engines: %+v", h.Engines)
	}
	if m := r.metric(t, engineUpMetric); m != engineUpMetric+" 0" {
		t.Errorf("metric %q, want %s 0", m, engineUpMetric)
	}
	if !strings.Contains(r.log.String(), "engine not answering") {
		t.Errorf("roched logged nothing about the engine going down")
	}
	cfg := roche.DefaultConfig()
	cfg.Image = "roche/python:local"
	var err error
	start := time.Now()
	_, err = r.provider.Create(context.Background(), cfg)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("a create with the engine down took %v; it should be refused at once", el)
	}
	if !errors.Is(err, roche.ErrUnavailable) {
		t.Errorf("create with the engine down: %v, want UNAVAILABLE", err)
	}
	notAnswering(t, "roched create", err, addr)
}

// assertUp: roched reports the engine up again and logs it.
func (r *rochedUnderTest) assertUp(t *testing.T) {
	t.Helper()
	eventually(t, r.every+5*time.Second+margin, "roched to report the engine up", func() bool {
		return r.health(t).Status == "ok"
	})
	if m := r.metric(t, engineUpMetric); m != engineUpMetric+" 1" {
		t.Errorf("metric %q, want %s 1", m, engineUpMetric)
	}
	if !strings.Contains(r.log.String(), "engine answering again") {
		t.Errorf("roched logged nothing about the engine coming back")
	}
}

// TestRochedEngineDownAndBack: roched's engine stops answering (a proxy in front of the
// real one withholds every answer) and comes back; roched says so both times, refuses
// creates at once meanwhile, and serves them again after.
func TestRochedEngineDownAndBack(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	proxy := newEngineProxy(t)
	rd := startRoched(t, "unix://"+proxy.socket, 200*time.Millisecond)
	cfg := roche.DefaultConfig()
	cfg.Image = img
	ctx := context.Background()
	if _, err := rd.provider.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if m := rd.metric(t, engineUpMetric); m != engineUpMetric+" 1" {
		t.Errorf("metric %q, want %s 1", m, engineUpMetric)
	}

	proxy.set(true, nil, nil)
	rd.assertDown(t, "unix://"+proxy.socket)
	proxy.set(false, nil, nil)
	rd.assertUp(t)

	sb, err := rd.provider.Create(ctx, cfg)
	if err != nil {
		t.Fatalf("create once the engine is back: %v", err)
	}
	if res, err := rd.provider.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"echo", "back"}}); err != nil || res.Stdout != "back\n" {
		t.Fatalf("exec once the engine is back: %+v %v", res, err)
	}
	rd.destroyAll(t)
	noneLeft(t, real, img, 30*time.Second)
}

// TestRochedDownRefusesItsSandboxes: with roched gone, the CLI does not silently act
// on a sandbox roched made (which may depend on env and workdir only roched applies):
// it says so and how to go on; --direct goes on.
func TestRochedDownRefusesItsSandboxes(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	rd := startRoched(t, "unix://"+dockerSocket, time.Second)
	cfg := roche.DefaultConfig()
	cfg.Image = img
	cfg.Env = map[string]string{"FROM_ROCHED": "yes"}
	sb, err := rd.provider.Create(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer real.Destroy(context.Background(), sb.ID)
	// A graceful stop leaves the sandboxes clients hold, listed in the state file, for
	// the next roched.
	rd.stop(t)

	env := []string{"ROCHE_SOCKET=" + rd.socket}
	for _, args := range [][]string{
		{"exec", "--sandbox", sb.ID, "--", "true"},
		{"exec", "--sandbox", sb.ID[:12], "--", "true"},
		{"destroy", sb.ID},
		{"pause", sb.ID},
	} {
		id := args[len(args)-1]
		if args[0] == "exec" {
			id = args[2]
		}
		want := "sandbox " + id + " is managed by roched, which is not answering on " + rd.socket +
			": start it (roche daemon start) or pass --direct to act on it without its env and workdir"
		r := runRoche(t, env, args...)
		if r.code == 0 || !strings.Contains(r.stderr, want) || strLines(r.stderr) != 1 {
			t.Errorf("roche %v with roched down: %+v, want one line saying %q", args, r, want)
		}
	}
	r := runRoche(t, env, "--direct", "exec", "--sandbox", sb.ID, "--", "sh", "-c", "echo ${FROM_ROCHED:-unset}")
	if r.code != 0 || r.stdout != "yes\n" {
		t.Errorf("roche --direct exec: %+v", r)
	}
	if r := runRoche(t, env, "--direct", "destroy", sb.ID); r.code != 0 {
		t.Errorf("roche --direct destroy: %+v", r)
	}
	noneLeft(t, real, img, 30*time.Second)
}
