package docker_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
)

// leaseChildEnv makes the test binary a process that creates a sandbox (leased when the
// value is "leased"), prints its id and waits to be killed: the creator whose death the
// lease tests watch.
const leaseChildEnv = "ROCHE_TEST_LEASE_CHILD"

// leaseChild is that process's main.
func leaseChild(mode string) int {
	p, err := docker.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	info, err := p.CreateFor(context.Background(), testConfig(), kit.CreateOptions{Leased: mode == "leased"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(info.ID)
	// Until killed. Sleeping, not an empty select: with nothing else running, the
	// runtime would take that for a deadlock and end the process itself.
	time.Sleep(10 * time.Minute)
	return 1
}

// creatorKilled starts a creator process, waits for its sandbox, kills the creator with
// SIGKILL (no cleanup can run) and returns the sandbox id and when the kill happened.
func creatorKilled(t *testing.T, mode string) (string, time.Time) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leaseChildEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ids := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ids <- strings.TrimSpace(line)
	}()
	var id string
	select {
	case id = <-ids:
	case <-time.After(2 * time.Minute):
	}
	cmd.Process.Kill()
	killed := time.Now()
	cmd.Wait()
	if id == "" {
		t.Fatal("the creator printed no sandbox id")
	}
	return id, killed
}

// TestLeasedSandboxGoesWithItsCreator: a leased sandbox whose creator is killed outright
// is gone within seconds (the lease's grace), long before its lifetime; an unleased one
// (roche create's) lives on.
func TestLeasedSandboxGoesWithItsCreator(t *testing.T) {
	p := newProvider(t)
	events := watch(t, p)
	id, killed := creatorKilled(t, "leased")
	t.Cleanup(func() { p.Destroy(context.Background(), id) })
	waitEvent(t, events, id, time.Until(killed.Add(10*time.Second)), func(ev kit.SandboxEvent) bool { return ev.Kind == kit.EventRemoved })
	t.Logf("the leased sandbox was gone %v after its creator was killed", time.Since(killed).Round(100*time.Millisecond))
	if _, err := p.Inspect(context.Background(), id); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("the leased sandbox, removed, still inspects: %v", err)
	}

	kept, killed := creatorKilled(t, "unleased")
	t.Cleanup(func() { p.Destroy(context.Background(), kept) })
	time.Sleep(time.Until(killed.Add(2 * docker.LeaseGrace)))
	if _, err := p.Inspect(context.Background(), kept); err != nil {
		t.Fatalf("an unleased sandbox went with its creator: %v", err)
	}
}

// TestKeepEndsTheLease: a leased sandbox whose lease was ended (a pooled sandbox handed
// to roche create) outlives the provider that held it; Keep on an unleased sandbox says
// it has no lease.
func TestKeepEndsTheLease(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	holder, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	info, err := holder.CreateFor(context.Background(), testConfig(), kit.CreateOptions{Leased: true})
	if err != nil {
		holder.Close()
		t.Fatal(err)
	}
	p := newProvider(t)
	t.Cleanup(func() { p.Destroy(context.Background(), info.ID) })
	if err := holder.Keep(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	holder.Close() // lets go of every lease it held
	time.Sleep(2 * docker.LeaseGrace)
	if got := execOK(t, p, info.ID, "echo", "kept"); got != "kept\n" {
		t.Fatalf("a kept sandbox: %q", got)
	}

	plain := sandbox(t, p, testConfig())
	if err := p.Keep(context.Background(), plain); !errors.Is(err, roche.ErrUnsupported) {
		t.Fatalf("Keep on an unleased sandbox: %v, want ErrUnsupported", err)
	}
}

// TestLeasedRefusedWithoutAgent: the exec-API transport has no agent to hold a lease, and
// says so.
func TestLeasedRefusedWithoutAgent(t *testing.T) {
	p := newProvider(t, docker.WithTransport(docker.TransportDockerExec))
	if _, err := p.CreateFor(context.Background(), testConfig(), kit.CreateOptions{Leased: true}); !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "leased") {
		t.Fatalf("a leased sandbox without roche-agent: %v", err)
	}
	if p.Capabilities().Leases {
		t.Fatal("the exec-API transport claims leases")
	}
}
