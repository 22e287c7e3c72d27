package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
)

// holder is the test binary as a client process of its own (ROCHED_TEST_AS_HOLDER=1):
// it creates a leased sandbox through roched at socket, prints its id and holds it until
// it is killed.
func holder(socket string) int {
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg := pyConfig()
	sb, _, err := c.CreateFor(context.Background(), "docker", cfg, kit.CreateOptions{Leased: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(sb.ID)
	select {} // held until killed
}

// ended waits for roched to answer Inspect of id with why it ended, and returns that.
func ended(t *testing.T, td *testDaemon, id string, within time.Duration) roche.SandboxInfo {
	t.Helper()
	var sb roche.SandboxInfo
	eventually(t, within, "sandbox "+id+" to end", func() bool {
		var err error
		sb, err = td.p.InspectEnded(context.Background(), id)
		if err != nil {
			t.Fatalf("inspect of sandbox %s: %v (an ended sandbox must be inspectable)", id, err)
		}
		return sb.End != nil
	})
	if sb.State != roche.StateExited {
		t.Errorf("ended sandbox %s: state %s, want exited", id, sb.State)
	}
	t.Logf("%s: %s", id, sb.End)
	return sb
}

// TestWhyItEnded: roched records why each sandbox ended, and Inspect, the Hold stream
// and the metrics say so: a destroy names the caller's tenant, a short lifetime is its
// lifetime, and a leased sandbox whose holder process was killed -9 is lease_lost.
func TestWhyItEnded(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	td := startDaemon(t, Config{})
	ctx := ctxFor(t, 3*time.Minute)

	// Destroyed by its tenant.
	sb, _, err := td.c.Create(ctx, "docker", pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := td.p.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got := ended(t, td, sb.ID, 10*time.Second)
	if got.End.Kind != roche.EndDestroyed || got.End.By != "tenant:"+ledger.LocalTenant || got.Image != sb.Image {
		t.Errorf("destroyed: %+v, want kind destroyed by tenant:%s with its image %s", *got.End, ledger.LocalTenant, sb.Image)
	}
	// By a unique prefix too, as every other call.
	if short, err := td.p.InspectEnded(ctx, sb.ID[:12]); err != nil || short.ID != sb.ID || short.End == nil {
		t.Errorf("inspect by prefix: %+v %v", short, err)
	}

	// A holder killed -9 while holding: lease lost, and its Hold stream's evidence.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$", td.socket)
	cmd.Env = append(os.Environ(), "ROCHED_TEST_AS_HOLDER=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the holder printed no id: %v", err)
	}
	leasedID := strings.TrimSpace(line)
	// Held past the first-hold wait, so that its end is a holder gone, not one never come.
	eventually(t, 30*time.Second, "the holder's Hold to count in", func() bool {
		r, ok := td.d.ledger.Tracked(leasedID)
		return ok && r.Leased && td.d.ledger.Holders(leasedID) > 0
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	got = ended(t, td, leasedID, ledger.HoldGrace+20*time.Second)
	if got.End.Kind != roche.EndLeaseLost || !strings.Contains(got.End.Evidence, "after its last one ended") {
		t.Errorf("holder killed: %+v, want lease_lost with the Hold stream's evidence", *got.End)
	}

	// Its lifetime.
	cfg := pyConfig()
	cfg.TimeoutSecs = 2
	short, _, err := td.c.Create(ctx, "docker", cfg)
	if err != nil {
		t.Fatal(err)
	}
	got = ended(t, td, short.ID, 30*time.Second)
	if got.End.Kind != roche.EndLifetime || got.End.Evidence == "" {
		t.Errorf("a 2 s lifetime: %+v, want lifetime with evidence", *got.End)
	}

	// The metrics count each reason.
	metrics := scrape(t, td)
	for _, want := range []string{`roche_sandboxes_ended_total{reason="destroyed"} 1`, `roche_sandboxes_ended_total{reason="lease_lost"} 1`,
		`roche_sandboxes_ended_total{reason="lifetime"} 1`, `roche_sandboxes_ended_total{reason="oom"} 0`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// Without asking for ended ones, it is not found, as before.
	if _, err := td.p.Inspect(ctx, sb.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("plain inspect of an ended sandbox: %v, want not found", err)
	}

	// Another tenant's view: nothing (the local socket is one tenant here, so the ledger
	// is asked directly as another).
	if _, ok := td.d.ledger.InspectEnded(&ledger.Tenant{Name: "other"}, sb.ID); ok {
		t.Error("another tenant sees why a sandbox not its own ended")
	}
}

// scrape reads roched's /metrics over its socket.
func scrape(t *testing.T, td *testDaemon) string {
	t.Helper()
	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://roched/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: HTTP %d %v", resp.StatusCode, err)
	}
	return string(b)
}

// sandboxOOM is a command that makes the sandbox's main process, roche-agent, the OOM
// killer's victim, as a program can on purpose ("a program may lower its score back to
// the agent's, and then risk only its own sandbox", exec_linux.go): it lowers its
// oom_score_adj to the agent's and fills a memfd, memory that belongs to no process's
// resident set, with dd, whose own is smaller than the agent's.
var sandboxOOM = []string{"sh", "-c", `echo 0 > /proc/self/oom_score_adj && exec python3 -c '
import os
fd = os.memfd_create("fill", 0)
os.execvp("dd", ["dd", "if=/dev/zero", "of=/proc/self/fd/%d" % fd, "bs=64k"])'`}

// TestOOMEnds: a command past the memory limit (python allocating 256 MiB under 64m)
// is the OOM killer's victim and its receipt says oom, while the sandbox lives on; a
// program that gets roche-agent itself killed ends the sandbox, which roched records
// as oom from the engine's oom event, and Inspect says so.
func TestOOMEnds(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	td := startDaemon(t, Config{})
	ctx := ctxFor(t, 3*time.Minute)
	cfg := pyConfig()
	cfg.Memory = "64m"
	sb, _, err := td.c.Create(ctx, "docker", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = td.p.Destroy(context.Background(), sb.ID) })

	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "b = b'x' * (256 << 20)"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.Receipt == nil || res.Receipt.End != roche.EndOOM || !strings.Contains(res.Receipt.Evidence, "oom_kill") {
		t.Fatalf("allocating 256 MiB under 64m: exit %d OOMKilled %v receipt %+v, want the receipt to say oom from memory.events",
			res.ExitCode, res.OOMKilled, res.Receipt)
	}
	if info, err := td.p.Inspect(ctx, sb.ID); err != nil || info.State != roche.StateRunning {
		t.Fatalf("after its command's OOM kill the sandbox is %+v %v, want running", info, err)
	}

	res, err = td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: sandboxOOM})
	if err == nil {
		t.Fatalf("filling a memfd with the agent's OOM score: %+v, want the sandbox ended under it", res)
	}
	got := ended(t, td, sb.ID, 30*time.Second)
	if got.End.Kind != roche.EndOOM || !strings.Contains(got.End.Evidence, "oom") {
		t.Fatalf("a sandbox whose roche-agent the OOM killer took ended %+v, want oom with the engine's oom event as evidence", *got.End)
	}
	if m := scrape(t, td); !strings.Contains(m, `roche_sandboxes_ended_total{reason="oom"} 1`) {
		t.Errorf("metrics do not count the oom end:\n%s", m)
	}
}
