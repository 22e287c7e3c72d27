package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// roched runs the test binary as roched, a real process that can be killed.
type roched struct {
	cmd *exec.Cmd
	log *syncBuffer
}

func startRoched(t *testing.T, socket string, args ...string) *roched {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"--socket", socket, "--log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), "ROCHED_TEST_AS_DAEMON=1")
	r := &roched{cmd: cmd, log: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil { // not waited for by the test
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	r.listening(t, socket)
	return r
}

// listening waits for roched's "roched listening" line, and checks that the roched
// answering on socket is this one.
func (r *roched) listening(t *testing.T, socket string) {
	t.Helper()
	r.log.Await(t, "roched listening", nil, 30*time.Second)
	c, _ := client.New(client.WithSocket(socket))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if h, err := c.Health(ctx); err != nil || h.PID != r.cmd.Process.Pid {
		t.Fatalf("roched said it listens, and its socket answers %+v, %v (want pid %d)\n%s", h, err, r.cmd.Process.Pid, r.log)
	}
}

// containersOf lists the Roche containers made from img, straight from the engine.
func containersOf(t *testing.T, dc *dockerclient.Client, img string) []string {
	t.Helper()
	list, err := dc.ContainerList(context.Background(), container.ListOptions{
		All: true, Filters: filters.NewArgs(filters.Arg("label", "roche.managed=true")),
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range list {
		if c.Image == img {
			ids = append(ids, c.ID)
		}
	}
	sort.Strings(ids)
	return ids
}

// TestKill9Restart kills roched with SIGKILL while it holds a pool and two client
// sandboxes, restarts it, and checks that the client's sandboxes keep working (env and
// expiry included), the dead daemon's idle pool sandboxes are destroyed, and after a
// graceful stop nothing is left. Its sandboxes use an image tag of their own, so the
// check for leftovers is exact whatever else runs on the engine.
func TestKill9Restart(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	b := make([]byte, 4)
	rand.Read(b)
	img := "roche/python:kill9-" + hex.EncodeToString(b)
	ctx := ctxFor(t, 3*time.Minute)
	if err := dc.ImageTag(ctx, testImage(), img); err != nil {
		t.Fatalf("tagging %s: %v (the README's test command builds it)", testImage(), err)
	}
	var daemons []*roched
	defer func() {
		for _, d := range daemons {
			if d.cmd.ProcessState == nil {
				d.cmd.Process.Kill()
				d.cmd.Wait()
			}
		}
		for _, id := range containersOf(t, dc, img) {
			t.Errorf("container %s survived", id)
			dc.ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true})
		}
		dc.ImageRemove(context.Background(), img, image.RemoveOptions{})
	}()

	dir := shortDir(t)
	socket := filepath.Join(dir, "roched.sock")
	args := []string{"--pool", "docker/" + img + "?min=2&max=2"}
	first := startRoched(t, socket, args...)
	daemons = append(daemons, first)
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.Provider("docker")

	if _, err := c.PoolWarmup(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	cfg := roche.DefaultConfig()
	cfg.Image = img
	cfg.Env = map[string]string{"HELD": "still here"}
	held, pooled, err := c.Create(ctx, "docker", cfg)
	if err != nil || !pooled {
		t.Fatalf("pooled create: %v %v", pooled, err)
	}
	cold := roche.DefaultConfig()
	cold.Image = img
	cold.Memory = "256m"
	heldCold, err := p.Create(ctx, cold)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the refill so the dead daemon leaves two idle sandboxes behind.
	eventually(t, 30*time.Second, "the refill", func() bool {
		st, err := c.PoolStatus(ctx)
		return err == nil && st[0].Idle == 2 && st[0].Creating == 0
	})
	var idle []string
	for _, id := range containersOf(t, dc, img) {
		if id != held.ID && id != heldCold.ID {
			idle = append(idle, id)
		}
	}
	if len(idle) != 2 {
		t.Fatalf("%d idle pool containers, want 2", len(idle))
	}

	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.cmd.Wait()
	c.Close() // drop connections to the dead daemon

	second := startRoched(t, socket, args...)
	daemons = append(daemons, second)
	// The client's sandboxes work as before, the pooled one with its env and expiry.
	res, err := p.Exec(ctx, held.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo $HELD"}})
	if err != nil || res.Stdout != "still here\n" {
		t.Fatalf("pooled sandbox after restart: %+v %v\n%s", res, err, second.log)
	}
	if info, err := p.Inspect(ctx, held.ID); err != nil || !info.ExpiresAt.Equal(held.ExpiresAt) {
		t.Fatalf("expiry after restart: %v, want %v (%v)", info.ExpiresAt, held.ExpiresAt, err)
	}
	if res, err := p.Exec(ctx, heldCold.ID, roche.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("cold sandbox after restart: %+v %v", res, err)
	}
	// The dead daemon's idle sandboxes are destroyed; the new daemon fills its own pool.
	eventually(t, 30*time.Second, "the leftovers to go and the pool to refill", func() bool {
		now := containersOf(t, dc, img)
		for _, id := range idle {
			for _, n := range now {
				if n == id {
					return false
				}
			}
		}
		return len(now) == 4 // two held, two new idle
	})
	if !strings.Contains(second.log.String(), "pool_leftovers_destroyed=2") {
		t.Errorf("the restarted daemon does not report destroying 2 leftovers:\n%s", second.log)
	}

	for _, id := range []string{held.ID, heldCold.ID} {
		if err := p.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// A graceful stop drains the pool; it exits 0 and leaves nothing.
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.cmd.Wait(); err != nil {
		t.Fatalf("roched after SIGTERM: %v\n%s", err, second.log)
	}
	if left := containersOf(t, dc, img); len(left) != 0 {
		t.Fatalf("after a graceful stop %d containers are left\n%s", len(left), second.log)
	}
	if _, err := os.Stat(socket); err == nil {
		t.Error("the socket file outlived the daemon")
	}
}
