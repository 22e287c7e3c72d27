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
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/kubernetes"
	"github.com/roche-sandbox/roche/provider/oci"
	"golang.org/x/sys/unix"
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
// resident set, with dd, whose own is smaller than the agent's. The kernel's choice
// weighs resident sets, which reclaim shrinks under the limit (the agent's file pages),
// so now and then it takes dd after all: the command is then run again, a few times.
var sandboxOOM = []string{"sh", "-c", `echo 0 > /proc/self/oom_score_adj && exec python3 -c '
import os
fd = os.memfd_create("fill", 0)
os.execvp("dd", ["dd", "if=/dev/zero", "of=/proc/self/fd/%d" % fd, "bs=4k"])'`}

// TestOOMEnds: a command past the memory limit (python allocating 256 MiB under 64m)
// is the OOM killer's victim and its receipt says oom, while the sandbox lives on; a
// program that gets roche-agent itself killed ends the sandbox, which roched records
// as oom from the engine's oom event (docker: the engine's events; oci: the provider's
// watch of the sandbox cgroup's OOM-kill counter and of its PID 1), and Inspect says so.
func TestOOMEnds(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	td := startDaemon(t, Config{})
	oomEnds(t, td.c, td.p, "docker", scrape(t, td), func() string { return scrape(t, td) })
}

// TestOOMEndsOCI is TestOOMEnds on the oci provider, served by roched.
func TestOOMEndsOCI(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	state := filepath.Join("/run/roche-test", "oci-daemon-oom")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(state, 0)
		_ = os.RemoveAll(state)
	})
	p, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Socket: filepath.Join(shortDir(t), "roched.sock")}
	d, err := New(cfg, map[string]roche.Provider{oci.Name: p})
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		p.Close()
		t.Fatal(err)
	}
	c, err := client.New(client.WithSocket(cfg.Socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		c.Close()
		if left, err := p.List(ctx); err != nil || len(left) != 0 {
			t.Errorf("left behind: %v %v", left, err)
		}
		p.Close()
	})
	metrics := func() string {
		resp, err := unixHTTP(cfg.Socket).Get("http://roched/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	oomEnds(t, c, c.Provider(oci.Name), oci.Name, metrics(), metrics)
}

// TestOOMEndsKubernetes is TestOOMEnds on the kubernetes provider (the test cluster),
// served by roched: its watch of the Pods reads the kubelet's OOMKilled, exit 137.
func TestOOMEndsKubernetes(t *testing.T) {
	cluster := testcluster.Start(t)
	cl := cluster.Client(t)
	t.Cleanup(cl.Close) // last: the namespace's cleanup below uses it
	ns := cl.Namespace(t, "roche-daemon-oom")
	importAgentImage(t)
	socket := filepath.Join(shortDir(t), "r.sock")
	r := startRochedEnv(t, socket, nil, "--kubeconfig", cluster.Kubeconfig, "--namespace", ns)
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		stopRoched(t, r)
		if left := k8sPods(t, cl, ns); len(left) != 0 {
			t.Errorf("Pods left behind: %v", left)
		}
	})
	metrics := func() string {
		resp, err := unixHTTP(socket).Get("http://roched/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	oomEnds(t, c, c.Provider(kubernetes.Name), kubernetes.Name, metrics(), metrics)
}

// oomEnds is TestOOMEnds's body on one provider served by roched.
func oomEnds(t *testing.T, c *client.Client, p *client.Provider, provider, before string, metrics func() string) {
	ctx := ctxFor(t, 3*time.Minute)
	cfg := pyConfig()
	cfg.Memory = "64m"
	sb, _, err := c.Create(ctx, provider, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), sb.ID) })

	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "b = b'x' * (256 << 20)"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.Receipt == nil || res.Receipt.End != roche.EndOOM || !strings.Contains(res.Receipt.Evidence, "oom_kill") {
		t.Fatalf("allocating 256 MiB under 64m: exit %d OOMKilled %v receipt %+v, want the receipt to say oom from memory.events",
			res.ExitCode, res.OOMKilled, res.Receipt)
	}
	if info, err := p.Inspect(ctx, sb.ID); err != nil || info.State != roche.StateRunning {
		t.Fatalf("after its command's OOM kill the sandbox is %+v %v, want running", info, err)
	}

	for try := 1; ; try++ {
		res, err = p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: sandboxOOM})
		if err != nil {
			break
		}
		if try == 5 || !res.OOMKilled {
			t.Fatalf("filling a memfd with the agent's OOM score, %d times: %+v, want the sandbox ended under it", try, res)
		}
		t.Logf("try %d: the OOM killer took the filler, not roche-agent: again", try)
	}
	var got roche.SandboxInfo
	eventually(t, 30*time.Second, "sandbox "+sb.ID+" to end", func() bool {
		got, err = p.InspectEnded(context.Background(), sb.ID)
		if err != nil {
			t.Fatalf("inspect of sandbox %s: %v (an ended sandbox must be inspectable)", sb.ID, err)
		}
		return got.End != nil && got.End.Kind != roche.EndUnknown
	})
	t.Logf("%s: %s", sb.ID, got.End)
	if got.State != roche.StateExited || got.End.Kind != roche.EndOOM || !strings.Contains(got.End.Evidence, "oom") {
		t.Fatalf("a sandbox whose roche-agent the OOM killer took ended %s %+v, want exited, oom with the OOM event as evidence", got.State, *got.End)
	}
	// The metrics count the reason first recorded: unknown when the exec's end was seen
	// before the engine's event, which Inspect then says instead (docs/ended.md).
	oom, unknown := `roche_sandboxes_ended_total{reason="oom"} `, `roche_sandboxes_ended_total{reason="unknown"} `
	after := metrics()
	if n, m := counter(before, oom)+counter(before, unknown), counter(after, oom)+counter(after, unknown); m != n+1 {
		t.Errorf("metrics count %d oom or unknown ends, want %d", m, n+1)
	}
}

// counter is the value of the metric line starting with prefix, 0 if none.
func counter(metrics, prefix string) int {
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
