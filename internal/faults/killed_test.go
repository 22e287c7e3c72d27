package faults

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/provider/docker"
)

// rochedProc is roched built from this checkout, run as a process of its own so that it
// can be killed outright.
type rochedProc struct {
	cmd    *exec.Cmd
	log    *syncBuffer
	socket string
	c      *client.Client
	done   chan struct{}
}

// startRochedProc starts bin/roched with args, on a socket and state file of its own,
// and waits until it answers. At the test's end one still running is stopped gracefully.
func startRochedProc(t *testing.T, args ...string) *rochedProc {
	t.Helper()
	return startRochedIn(t, shortDir(t), args...)
}

// startRochedIn is startRochedProc with the socket and state file in dir, where a
// roched before it may have left its state.
func startRochedIn(t *testing.T, dir string, args ...string) *rochedProc {
	t.Helper()
	return startRochedEnv(t, dir, nil, args...)
}

// startRochedEnv is startRochedIn with env added to roched's environment.
func startRochedEnv(t *testing.T, dir string, env []string, args ...string) *rochedProc {
	t.Helper()
	socket := filepath.Join(dir, "roched.sock")
	cmd := exec.Command(filepath.Join(binDir, "roched"),
		append([]string{"--socket", socket, "--state", filepath.Join(dir, "state.json"), "--log-level", "debug"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	r := &rochedProc{cmd: cmd, log: &syncBuffer{}, socket: socket, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		close(r.done)
	}()
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	r.c = c
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(time.Minute):
				cmd.Process.Kill()
				<-r.done
			}
		}
		c.Close()
		if t.Failed() {
			t.Logf("roched log:\n%s", r.log.String())
		}
	})
	if !r.log.Await(t, "roched listening", r.done, 30*time.Second) {
		t.Fatalf("roched exited: %s", r.log.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if h, err := c.Health(ctx); err != nil || h.PID != cmd.Process.Pid {
		t.Fatalf("roched said it listens, and its socket answers %+v, %v (want pid %d)", h, err, cmd.Process.Pid)
	}
	return r
}

// kill kills roched with SIGKILL and waits for it to be gone.
func (r *rochedProc) kill(t *testing.T) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-r.done
}

// poolCounts is what roched's pools hold: idle, being created, and hits so far.
func (r *rochedProc) poolCounts(t *testing.T) (idle, creating int, hits uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pools, err := r.c.PoolStatus(ctx)
	if err != nil {
		t.Fatalf("pool status: %v", err)
	}
	for _, p := range pools {
		idle += int(p.Idle)
		creating += int(p.Creating)
		hits += p.Hits
	}
	return idle, creating, hits
}

// TestRochedKilledDuringRefill kills roched (SIGKILL) while its pool is being filled:
// some members idle, some being created. Nobody restarts it. The pool's sandboxes are
// leased to roched, so the idle ones stop within the lease's grace and the ones it was
// still creating within the agent's wait for a first lease (roched's engine timeout and
// 5 s); the engine removes them. Nothing lives on to its lifetime.
func TestRochedKilledDuringRefill(t *testing.T) {
	real := realProvider(t)
	watchRemovals(t)
	img := privateImage(t)
	const engineTimeout = 10 * time.Second
	rd := startRochedProc(t, "--engine-timeout", engineTimeout.String(), "--pool-concurrency", "2",
		"--pool", "docker/"+img+"?min=8&max=8")
	var idle, creating int
	eventually(t, 2*time.Minute, "the pool to be half filled, members still being created", func() bool {
		idle, creating, _ = rd.poolCounts(t)
		return idle >= 2 && creating >= 1
	})
	rd.kill(t)
	killed := time.Now()
	idleIDs := rd.pooledInState(t)
	t.Logf("roched killed with %d idle (%d in its state file) and %d being created; the engine has %d of its sandboxes",
		idle, len(idleIDs), creating, len(sandboxesFrom(t, real, img)))
	if len(idleIDs) < 2 {
		t.Fatalf("roched's state file lists %d idle pooled sandboxes, want the 2 or more the pool reported", len(idleIDs))
	}

	// Every one the pool held idle goes within the grace and the engine's stop and
	// removal of the container (the agent exits; auto-remove).
	eventually(t, docker.LeaseGrace+2*time.Second+margin, "the idle pooled sandboxes to go", func() bool {
		now := sandboxesFrom(t, real, img)
		for _, id := range idleIDs {
			if contains(now, id) {
				return false
			}
		}
		return true
	})
	idleGone := time.Since(killed)
	// And the ones being created, within their wait for a first lease. A container the
	// engine had made but roched had not yet started never runs (no process, so no
	// lease): the next create on the engine, by any process, removes it once its
	// creator's deadline (and a slack) has passed.
	var unstarted []string
	// Their agents wait engineTimeout+5s for a first lease, counted from their start,
	// which the engine may finish a little after the kill; then the engine stops and
	// removes them.
	eventually(t, engineTimeout+5*time.Second+5*time.Second+margin, "the sandboxes being created to go", func() bool {
		unstarted = unstarted[:0]
		for _, sb := range sandboxesFrom(t, real, img) {
			if sb.State != roche.StateCreated {
				return false
			}
			unstarted = append(unstarted, sb.ID)
		}
		return true
	})
	startedGone := time.Since(killed)
	if len(unstarted) > 2 {
		t.Errorf("%d never-started containers left, more than the 2 creates roched makes at once: %v", len(unstarted), unstarted)
	}
	if len(unstarted) > 0 {
		dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
		if err != nil {
			t.Fatal(err)
		}
		defer dc.Close()
		var giveUp time.Time
		for _, id := range unstarted {
			c, err := dc.ContainerInspect(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			by, err := strconv.ParseInt(c.Config.Labels[docker.LabelStartBy], 10, 64)
			if err != nil {
				t.Fatalf("container %s has no %s label: %v", id, docker.LabelStartBy, err)
			}
			if at := time.Unix(by, 0); at.After(giveUp) {
				giveUp = at
			}
		}
		// roched's creates gave up at most engineTimeout after the kill; the sweep
		// leaves them 30 s more.
		if giveUp.After(killed.Add(engineTimeout + time.Second)) {
			t.Errorf("a create's give-up time %v is past the kill (%v) plus its engine timeout", giveUp, killed)
		}
		time.Sleep(time.Until(giveUp.Add(30*time.Second + time.Second)))
		next, err := docker.New(docker.WithLogger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		defer next.Close()
		cfg := roche.DefaultConfig()
		cfg.Image = img
		sb, err := next.Create(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := next.Destroy(context.Background(), sb.ID); err != nil {
			t.Fatal(err)
		}
		eventually(t, controlBound+margin, "the next create to remove the never-started containers", func() bool {
			now := sandboxesFrom(t, real, img)
			for _, id := range unstarted {
				if contains(now, id) {
					return false
				}
			}
			return true
		})
		t.Logf("%d never-started containers removed by the next create, %v after the kill", len(unstarted), time.Since(killed).Round(100*time.Millisecond))
	}
	noneLeft(t, real, img, 30*time.Second)
	t.Logf("after the kill: the idle pooled sandboxes gone in %v, every started one in %v",
		idleGone.Round(100*time.Millisecond), startedGone.Round(100*time.Millisecond))
}

// watchRemovals watches the engine's events for the length of the test, as a running
// roched does: the sandboxes of a roched the test killed end on their own (leases,
// lifetimes) and the engine removes them, and the watch then removes their agent
// directories on the host, which nobody alive would otherwise know to.
func watchRemovals(t *testing.T) {
	t.Helper()
	p, err := docker.New(docker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := p.Watch(ctx)
	if err != nil {
		cancel()
		p.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range ch {
		}
	}()
	t.Cleanup(func() {
		time.Sleep(time.Second) // the last removals' events, a moment behind the engine
		cancel()
		<-done
		p.Close()
	})
}

// pooledInState lists the idle pooled sandboxes roched's state file records.
func (r *rochedProc) pooledInState(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(filepath.Dir(r.socket), "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Sandboxes []struct {
			ID   string `json:"id"`
			Kind string `json:"kind"`
		} `json:"sandboxes"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("roched's state file: %v", err)
	}
	var ids []string
	for _, sb := range st.Sandboxes {
		if sb.Kind == "pooled" {
			ids = append(ids, sb.ID)
		}
	}
	return ids
}

// contains reports whether list holds the sandbox id.
func contains(list []roche.SandboxInfo, id string) bool {
	for _, sb := range list {
		if sb.ID == id {
			return true
		}
	}
	return false
}

// TestUnleasedPooledOutlivesRoched: a pooled sandbox handed to a create that did not ask
// for a lease (roche create, whose sandbox outlives the command) has its pool lease
// ended, so it outlives roched killed outright, past the grace, and keeps working.
func TestUnleasedPooledOutlivesRoched(t *testing.T) {
	real := realProvider(t)
	watchRemovals(t)
	img := privateImage(t)
	rd := startRochedProc(t, "--pool", "docker/"+img+"?min=1&max=1")
	eventually(t, time.Minute, "the pool to fill", func() bool {
		idle, creating, _ := rd.poolCounts(t)
		return idle == 1 && creating == 0
	})
	r := runRoche(t, []string{"ROCHE_SOCKET=" + rd.socket}, "create", "--image", img, "--json")
	var sb roche.SandboxInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sb) != nil || sb.ID == "" {
		t.Fatalf("roche create through roched: %+v", r)
	}
	defer real.Destroy(context.Background(), sb.ID)
	if _, _, hits := rd.poolCounts(t); hits != 1 {
		t.Fatalf("the create was not served from the pool (%d hits)", hits)
	}
	// Killed mid-refill is TestRochedKilledDuringRefill's: here the pool is full again.
	eventually(t, time.Minute, "the pool to refill", func() bool {
		idle, creating, _ := rd.poolCounts(t)
		return idle == 1 && creating == 0
	})

	rd.kill(t)
	time.Sleep(docker.LeaseGrace + 5*time.Second)
	ctx := context.Background()
	res, err := real.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"echo", "still here"}})
	if err != nil || res.Stdout != "still here\n" {
		t.Fatalf("the sandbox roche create made, %v after roched was killed: %+v %v", docker.LeaseGrace+5*time.Second, res, err)
	}
	if err := real.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// The pool's new member, made after the hand-out, was roched's: it goes with it.
	noneLeft(t, real, img, 30*time.Second)
}
