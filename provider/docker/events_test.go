package docker_test

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
)

// engineClient is a plain Engine API client on the real engine, for doing to a test's
// own containers (by id) what a user or the engine itself would.
func engineClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// watch starts p.Watch for the test; at its end the watch is stopped and its channel
// must close (its goroutine is gone).
func watch(t *testing.T, p *docker.Provider) <-chan kit.SandboxEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := p.Watch(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	events := make(chan kit.SandboxEvent, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range ch {
			// Other tests' sandboxes on the shared engine have events too: never block
			// the end of the watch on a reader that has stopped.
			select {
			case events <- ev:
			case <-ctx.Done():
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the watch did not end within 10 s of its context")
		}
	})
	return events
}

// waitEvent returns the first event for id that match accepts, failing after d.
func waitEvent(t *testing.T, events <-chan kit.SandboxEvent, id string, d time.Duration, match func(kit.SandboxEvent) bool) kit.SandboxEvent {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case ev := <-events:
			if ev.ID == id && match(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no matching event for sandbox %s within %v", id, d)
		}
	}
}

// TestWatchSeesKill: a sandbox killed behind the provider's back (docker kill of its own
// container, by id) is reported within seconds, with its exit status, then as removed.
func TestWatchSeesKill(t *testing.T) {
	p := newProvider(t)
	events := watch(t, p)
	id := sandbox(t, p, testConfig())
	dc := engineClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := dc.ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	dir := c.Config.Labels[docker.LabelAgentDir]
	killed := time.Now()
	if err := dc.ContainerKill(ctx, id, "KILL"); err != nil {
		t.Fatal(err)
	}
	died := waitEvent(t, events, id, 5*time.Second, func(ev kit.SandboxEvent) bool { return ev.Kind == kit.EventDied })
	if !died.ExitKnown || died.ExitCode != 137 || died.Provider != "docker" || died.Resync || !died.Ended() {
		t.Errorf("died event %+v: want exit 137 known, provider docker, seen live", died)
	}
	t.Logf("died event %v after the kill: %s", time.Since(killed).Round(time.Millisecond), died.Reason())
	waitEvent(t, events, id, 10*time.Second, func(ev kit.SandboxEvent) bool { return ev.Kind == kit.EventRemoved })
	// The sandbox is reported gone, not served from a stale cache.
	if err := p.Probe(ctx, id); err == nil {
		t.Error("Probe of a killed sandbox succeeded")
	}
	// And its agent directory on the host went with the container, before any Destroy.
	if _, err := os.Stat(dir); dir == "" || !os.IsNotExist(err) {
		t.Errorf("the removed sandbox's agent directory %q is still there (%v)", dir, err)
	}
}

// TestWatchReconnects: the watch survives its engine connection being cut (a proxy in
// front of the real engine, which the test closes and opens again, standing in for an
// engine restart without restarting the shared one). What happened while it was cut is
// found by comparing with the list, even when the engine has forgotten its events.
func TestWatchReconnects(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	proxy := newCuttableProxy(t)
	pc, err := client.NewClientWithOpts(client.WithHost("unix://"+proxy.socket), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p := newProvider(t, docker.WithClient(pc), docker.WithLogger(log))
	events := watch(t, p)
	a := sandbox(t, p, testConfig())
	b := sandbox(t, p, testConfig())
	dc := engineClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	proxy.cut()
	eventually(t, 10*time.Second, "the watch to notice the cut", func() bool {
		return strings.Contains(logs.String(), "reconnecting")
	})
	// Killed while the watch cannot hear of it; the engine removes it (AutoRemove).
	if err := dc.ContainerKill(ctx, a, "KILL"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the killed sandbox to be removed", func() bool {
		_, err := dc.ContainerInspect(ctx, a)
		return err != nil
	})
	// As a restarted engine would, the proxy drops the request to replay past events.
	proxy.restore(true)
	ev := waitEvent(t, events, a, 15*time.Second, func(ev kit.SandboxEvent) bool { return ev.Ended() })
	if !ev.Resync || ev.Kind != kit.EventRemoved {
		t.Errorf("event for the sandbox killed during the cut: %+v, want removed, found by resync", ev)
	}
	if !strings.Contains(logs.String(), "watching sandbox events again") {
		t.Errorf("the reconnection was not logged:\n%s", logs.String())
	}
	t.Logf("watch log:\n%s", logs.String())
	// And the stream is live again.
	if err := dc.ContainerKill(ctx, b, "KILL"); err != nil {
		t.Fatal(err)
	}
	ev = waitEvent(t, events, b, 5*time.Second, func(ev kit.SandboxEvent) bool { return ev.Kind == kit.EventDied })
	if ev.Resync || ev.ExitCode != 137 {
		t.Errorf("event after the reconnection: %+v, want a live die with exit 137", ev)
	}
}

// cuttableProxy passes Engine API requests to the real engine over a unix socket of its
// own, which cut closes (every connection, the event stream included, and the socket)
// and restore opens again.
type cuttableProxy struct {
	socket string
	rp     *httputil.ReverseProxy

	mu  sync.Mutex
	srv *http.Server
	// forget drops "since" from event subscriptions: the engine has no past to replay.
	forget bool
}

func newCuttableProxy(t *testing.T) *cuttableProxy {
	t.Helper()
	dir, err := os.MkdirTemp("", "rw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = "unix:///var/run/docker.sock"
	}
	engineSocket, ok := strings.CutPrefix(host, "unix://")
	if !ok {
		t.Fatalf("DOCKER_HOST %s: the proxy needs the engine on a unix socket", host)
	}
	p := &cuttableProxy{socket: filepath.Join(dir, "engine.sock")}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", engineSocket)
	}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "http", "docker"
			p.mu.Lock()
			forget := p.forget
			p.mu.Unlock()
			if forget && strings.HasSuffix(r.Out.URL.Path, "/events") {
				q := r.Out.URL.Query()
				q.Del("since")
				r.Out.URL.RawQuery = q.Encode()
			}
		},
		Transport:     tr,
		FlushInterval: -1, // the event stream passes as it comes
	}
	p.restore(false)
	t.Cleanup(func() {
		p.cut()
		tr.CloseIdleConnections()
	})
	return p
}

func (p *cuttableProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		p.srv.Close() // the listener (which removes the socket) and every connection
		p.srv = nil
	}
}

func (p *cuttableProxy) restore(forget bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forget = forget
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		panic(err)
	}
	p.srv = &http.Server{Handler: p.rp}
	go p.srv.Serve(l)
}

// BenchmarkProbe measures the check a pool makes before handing a sandbox out: a
// connection to the sandbox's roche-agent.
func BenchmarkProbe(b *testing.B) {
	p, err := docker.New()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	b.ResetTimer()
	for range b.N {
		if err := p.Probe(ctx, info.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// The shared test helpers (internal/testenv), under this package's names.
var eventually = testenv.Eventually

type syncBuffer = testenv.SyncBuffer
