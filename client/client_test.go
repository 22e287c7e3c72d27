package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestMain builds roche-agent, so sandboxes run as they do in production.
func TestMain(m *testing.M) {
	cleanup, err := testenv.SetupAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// goleak exits the process itself; the agent's directory goes first.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { cleanup(); os.Exit(code) }))
}

func testImage() string {
	if img := os.Getenv("ROCHE_TEST_IMAGE"); img != "" {
		return img
	}
	return "roche/python:local"
}

// serve runs a daemon in-process with the real Docker provider and a pool for the test
// image, and returns a client of it.
func serve(t *testing.T) (*client.Client, *docker.Provider) {
	c, dp, _ := serveDaemon(t)
	return c, dp
}

func serveDaemon(t *testing.T) (*client.Client, *docker.Provider, *daemon.Daemon) {
	t.Helper()
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=2&max=2")
	if err != nil {
		t.Fatal(err)
	}
	s := daemontest.Serve(t, daemon.Config{Pools: []pool.Spec{spec}})
	return s.Client, s.Docker, s.Daemon
}

// TestConformance runs the provider conformance suite through the daemon: the client is
// a roche.Provider like any other, and every security claim holds in sandboxes served
// from the warm pool (env and workdir applied at exec time) as in cold ones.
func TestConformance(t *testing.T) {
	c, _, d := serveDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.PoolWarmup(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	cfg := roche.DefaultConfig()
	cfg.Image = testImage()
	// roched owns what it makes, for the unix socket's tenant, whatever the config said.
	providertest.Run(t, c.Provider("docker"), providertest.Options{Config: cfg, Owner: d.OwnerOf(daemon.LocalTenant)})
	// A context of its own: the suite takes longer than the warm-up's minute.
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	st, err := c.PoolStatus(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Hits == 0 {
		t.Errorf("no create of the suite was served from the pool: %v", st[0])
	}
	t.Logf("pool: %d hits, %d misses", st[0].Hits, st[0].Misses)
}

// TestSameAsInProcess: what the daemon says about its provider and a sandbox is what the
// provider says in-process, every field (capabilities and the transport once got lost on
// the wire).
func TestSameAsInProcess(t *testing.T) {
	c, dp := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := c.Provider("docker")
	if got, want := p.Capabilities(), dp.Capabilities(); !reflect.DeepEqual(got, want) {
		t.Errorf("capabilities through roched %+v, in-process %+v", got, want)
	}
	cfg := roche.DefaultConfig()
	cfg.Image = testImage()
	cfg.Writable = true // not poolable: a cold create
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	direct, err := dp.Inspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if direct.Transport != docker.TransportAgent {
		t.Fatalf("in-process transport %q, want %q", direct.Transport, docker.TransportAgent)
	}
	viaDaemon, err := p.Inspect(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if viaDaemon.Transport != direct.Transport || sb.Transport != direct.Transport {
		t.Errorf("transport through roched: create %q, inspect %q; in-process %q", sb.Transport, viaDaemon.Transport, direct.Transport)
	}
	if viaDaemon.Owner != direct.Owner || sb.Owner != direct.Owner || !strings.HasPrefix(direct.Owner, "roched:") {
		t.Errorf("owner through roched: create %q, inspect %q; in-process %q", sb.Owner, viaDaemon.Owner, direct.Owner)
	}
}

func TestUnreachable(t *testing.T) {
	c, err := client.New(client.WithSocket(filepath.Join(t.TempDir(), "none.sock")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	_, err = c.Health(ctx)
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "roche daemon start") {
		t.Fatalf("health: %v", err)
	}
	_, err = c.Provider("docker").Create(ctx, roche.DefaultConfig())
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "roched is not answering") {
		t.Fatalf("create: %v", err)
	}
	if _, err := client.New(client.WithAddress("127.0.0.1:80")); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("address without a scheme: %v", err)
	}
}

func TestDefaultSocket(t *testing.T) {
	t.Setenv("ROCHE_SOCKET", "")
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
	if got := client.DefaultSocket(); got != "/run/user/1000/roche/roched.sock" {
		t.Fatalf("with XDG_RUNTIME_DIR: %s", got)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("HOME", "/home/ada")
	if got := client.DefaultSocket(); got != "/home/ada/.roche/roched.sock" {
		t.Fatalf("with HOME: %s", got)
	}
	t.Setenv("ROCHE_SOCKET", "/tmp/r.sock")
	if got := client.DefaultSocket(); got != "/tmp/r.sock" {
		t.Fatalf("with ROCHE_SOCKET: %s", got)
	}
	if got := client.StateFile("/tmp/r.sock"); got != "/tmp/r.state.json" {
		t.Fatalf("state file: %s", got)
	}
}
