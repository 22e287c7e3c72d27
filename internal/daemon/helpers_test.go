package daemon

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// TestMain lets the test binary double as roched for the kill -9 test, which needs a
// real process to kill (ROCHED_TEST_AS_DAEMON=1), and builds roche-agent so sandboxes run
// as they do in production (the subprocess inherits ROCHE_AGENT).
func TestMain(m *testing.M) {
	// The qemu provider runs each VM's supervisor as this binary (TestConsoleUsageQEMU).
	supervisor.RunIfAsked()
	if os.Getenv("ROCHED_TEST_AS_DAEMON") == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	if os.Getenv("ROCHED_TEST_AS_HOLDER") == "1" {
		os.Exit(holder(os.Args[len(os.Args)-1]))
	}
	if os.Getenv("ROCHED_TEST_AS_OTHER_USER") == "1" {
		os.Exit(otherUser(os.Args[1:]))
	}
	cleanup, err := testenv.SetupAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The roched processes these tests start serve the direct-mode sandboxes of this
	// owner alone (--direct-owner's default): none that other tests on the machine make
	// as this user with roche.
	os.Setenv("ROCHE_OWNER", fmt.Sprintf("cli:daemon-test-%d", os.Getpid()))
	// goleak exits the process itself; the agent's directory goes first.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { cleanup(); os.Exit(code) }))
}

func testImage() string {
	if img := os.Getenv("ROCHE_TEST_IMAGE"); img != "" {
		return img
	}
	return "roche/python:local"
}

// recorder is the real Docker provider, remembering every sandbox made through it so a
// test can check that each one is gone at the end, whatever else runs on the engine.
type recorder struct {
	*docker.Provider
	mu      sync.Mutex
	created []string
	lists   atomic.Int64 // calls of List: each reconcile of the daemon makes one
}

func (r *recorder) List(ctx context.Context) ([]roche.SandboxInfo, error) {
	r.lists.Add(1)
	return r.Provider.List(ctx)
}

func (r *recorder) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return r.CreateFor(ctx, cfg, kit.CreateOptions{})
}

// CreateFor records too: roched creates through it (kit.Create), and the embedded
// provider's would not record.
func (r *recorder) CreateFor(ctx context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	sb, err := r.Provider.CreateFor(ctx, cfg, opts)
	if err == nil {
		r.mu.Lock()
		r.created = append(r.created, sb.ID)
		r.mu.Unlock()
	}
	return sb, err
}

// Reset records the new sandbox: the provider makes it without going through Create.
func (r *recorder) Reset(ctx context.Context, id string, keepWorkspace bool) (roche.SandboxInfo, error) {
	sb, err := r.Provider.Reset(ctx, id, keepWorkspace)
	if err == nil {
		r.mu.Lock()
		r.created = append(r.created, sb.ID)
		r.mu.Unlock()
	}
	return sb, err
}

func (r *recorder) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.created...)
}

// newRecorder connects to the engine, failing (not skipping) when it is absent: the
// README's test command starts it.
func newRecorder(t *testing.T, opts ...docker.Option) *recorder {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	p, err := docker.New(append([]docker.Option{docker.WithEgressProxy()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		p.Close()
		t.Fatalf("%v (the README's test command starts dockerd and builds the image)", err)
	}
	return &recorder{Provider: p}
}

// shortDir is a temporary directory with a short path, for unix sockets.
var shortDir = testenv.ShortDir

type testDaemon struct {
	d      *Daemon
	rec    *recorder
	c      *client.Client
	p      *client.Provider
	socket string
}

// startDaemon runs a daemon in-process on a fresh socket with the real Docker provider.
// At the end it destroys what the test left, shuts the daemon down and fails the test if
// any sandbox made through it survived.
func startDaemon(t *testing.T, cfg Config, opts ...Option) *testDaemon {
	t.Helper()
	return startDaemonOn(t, cfg, newRecorder(t), opts...)
}

// startDaemonOn is startDaemon with a Docker provider of the test's making.
func startDaemonOn(t *testing.T, cfg Config, rec *recorder, opts ...Option) *testDaemon {
	t.Helper()
	dir := shortDir(t)
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(dir, "roched.sock")
	}
	opts = append([]Option{WithPoolOptions(pool.WithJanitorInterval(100 * time.Millisecond))}, opts...)
	d, err := New(cfg, map[string]roche.Provider{"docker": rec}, opts...)
	if err != nil {
		rec.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		rec.Close()
		t.Fatal(err)
	}
	c, err := client.New(client.WithSocket(cfg.Socket), client.WithToken(cfg.Token))
	if err != nil {
		t.Fatal(err)
	}
	td := &testDaemon{d: d, rec: rec, c: c, p: c.Provider("docker"), socket: cfg.Socket}
	t.Cleanup(func() { td.stop(t) })
	return td
}

// stop destroys the sandboxes the test left to the daemon, shuts it down and checks
// that nothing made through it survived. It may be called twice.
func (td *testDaemon) stop(t *testing.T) {
	t.Helper()
	if td.d == nil {
		return
	}
	for _, r := range td.d.ledger.Records() {
		if r.Kind == ledger.KindClient {
			// As its own tenant would: the ledger marks it destroyed and removes it.
			if _, err := td.d.ledger.Destroy(&ledger.Tenant{Name: r.TenantName()}, r.ID); err != nil {
				t.Errorf("destroying %s, left by the test: %v", r.ID, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := td.d.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	td.c.Close()
	td.assertGone(t)
	td.rec.Close()
	td.d = nil
}

// assertGone fails the test for every sandbox made through the recorder that still
// exists, and removes it.
func (td *testDaemon) assertGone(t *testing.T) {
	t.Helper()
	for _, id := range td.rec.ids() {
		if _, err := td.rec.Provider.Inspect(context.Background(), id); err == nil {
			t.Errorf("sandbox %s survived", id)
			_ = td.rec.Provider.Destroy(context.Background(), id)
		}
	}
}

// unixHTTP is a plain HTTP client over the daemon's socket, for calls made the way
// curl would.
func unixHTTP(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
}

func pyConfig() roche.Config {
	cfg := roche.DefaultConfig()
	cfg.Image = testImage()
	return cfg
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// gone reports whether the engine no longer has the sandbox.
func (td *testDaemon) gone(id string) bool {
	_, err := td.rec.Provider.Inspect(context.Background(), id)
	return err != nil
}

// The shared test helpers (internal/testenv), under this package's names.
var eventually = testenv.Eventually

type syncBuffer = testenv.SyncBuffer
