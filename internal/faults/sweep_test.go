package faults

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// TestSweepKeepsToItsEngine: a roche or roched using a second Docker engine on the same
// host, with the same state directory (every one shares /run/roche/docker by default),
// sweeps the agent directories of its own sandboxes that are gone, and never those of
// the first engine's live sandboxes, which its engine does not list. Once it removed
// every directory its engine did not list: the first engine's sandboxes lost their
// agent's socket, and with it every exec and file operation.
func TestSweepKeepsToItsEngine(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	state := shortDir(t)
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()

	// A live sandbox on the shared engine, as old as one may be: its creator's deadline
	// and its directory's last change an hour ago.
	first, err := docker.New(docker.WithStateDir(state), docker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	info, err := first.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Destroy(context.Background(), info.ID) })
	liveDir := agentDirOf(ctx, t, engineClient(t, ""), info.ID)
	age(t, liveDir, time.Hour)

	// The second engine, and a provider on it that sweeps: after its own create (in the
	// background, which Close waits for) and in a gc.
	d := startPrivateDockerd(t)
	dc := d.client(t)
	second, err := docker.New(docker.WithClient(dc), docker.WithStateDir(state), docker.WithEngineTimeout(5*time.Second),
		docker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			second.Close()
		}
	}()
	own, err := second.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ownDir := agentDirOf(ctx, t, dc, own.ID)
	// Its own sandbox ends behind its back (as at the end of its lifetime), and is as old.
	if err := dc.ContainerKill(ctx, own.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the second engine to remove its killed sandbox", func() bool {
		_, err := dc.ContainerInspect(ctx, own.ID)
		return cerrdefs.IsNotFound(err)
	})
	age(t, ownDir, time.Hour)
	if _, err := second.GC(ctx, roche.GCOptions{}); err != nil {
		t.Fatalf("gc on the second engine: %v", err)
	}
	second.Close()
	closed = true

	// The sweep worked: its own gone sandbox's directory went.
	if _, err := os.Stat(ownDir); !os.IsNotExist(err) {
		t.Errorf("the second engine's gone sandbox's agent directory %s is still there (%v)", ownDir, err)
	}
	// And kept to its engine: the first engine's sandbox still has its socket, and its
	// agent answers.
	// (Its sockets are in the subdirectory its LabelRunDir names, the one bound into it.)
	if _, err := os.Stat(filepath.Join(liveDir, "run", "agent.sock")); err != nil {
		t.Fatalf("the first engine's live sandbox lost its agent's socket to the second engine's sweep: %v", err)
	}
	res, err := first.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"echo", "alive"}, Timeout: time.Minute})
	if err != nil || res.Stdout != "alive\n" {
		t.Fatalf("the first engine's live sandbox after the sweep: %+v %v", res, err)
	}
}

// engineClient is an Engine API client of the engine at host ("" for the shared one).
func engineClient(t *testing.T, host string) *dockerclient.Client {
	t.Helper()
	opts := []dockerclient.Opt{dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation()}
	if host != "" {
		opts = append(opts, dockerclient.WithHost(host))
	}
	c, err := dockerclient.NewClientWithOpts(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// agentDirOf is the host directory of a sandbox's agent socket, from its label.
func agentDirOf(ctx context.Context, t *testing.T, c *dockerclient.Client, id string) string {
	t.Helper()
	ci, err := c.ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	dir := ci.Config.Labels[docker.LabelAgentDir]
	if _, err := os.Stat(dir); dir == "" || err != nil {
		t.Fatalf("sandbox %s's agent directory %q: %v", id, dir, err)
	}
	return dir
}

// age makes a sandbox's agent directory look as if its create had given up, and its
// directory had last changed, d ago.
func age(t *testing.T, dir string, d time.Duration) {
	t.Helper()
	then := time.Now().Add(-d)
	if err := os.WriteFile(filepath.Join(dir, "start_by"), []byte(strconv.FormatInt(then.Unix(), 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dir, then, then); err != nil {
		t.Fatal(err)
	}
}
