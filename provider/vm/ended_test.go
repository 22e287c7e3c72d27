//go:build linux

package vm_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/vm"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// TestQEMUKilledEnds: a qemu sandbox served by roched whose QEMU process is killed -9
// from the host is recorded, through the provider's watch of its supervisor (kit.Watcher),
// as agent_exited with the signal as evidence, within moments, not as unknown when
// someone next looks.
func TestQEMUKilledEnds(t *testing.T) {
	state := t.TempDir()
	p := newQEMU(t, vm.WithStateDir(state))
	sockDir, err := os.MkdirTemp("", "rq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	cfg := daemon.Config{Socket: filepath.Join(sockDir, "roched.sock")}
	d, err := daemon.New(cfg, map[string]roche.Provider{p.Name(): p})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := d.Start(ctx); err != nil {
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
	})
	rp := c.Provider(p.Name())
	sb, _, err := c.Create(ctx, p.Name(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rp.Destroy(context.Background(), sb.ID) })
	if res, err := rp.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec in the new VM: %+v %v", res, err)
	}

	// The VM's directory is the provider's, named by the sandbox: its QEMU's pid is there.
	dir := filepath.Join(state, sb.ID)
	qemu, _ := supervisor.ReadHypervisor(dir)
	if qemu <= 1 {
		t.Fatalf("no hypervisor pid recorded in %s", dir)
	}
	if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(qemu) + "/cmdline"); !strings.Contains(string(cmdline), "qemu") {
		t.Fatalf("pid %d is not the VM's QEMU: %q", qemu, cmdline)
	}
	began := time.Now()
	if err := syscall.Kill(qemu, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", qemu, err)
	}
	var got roche.SandboxInfo
	testenv.Eventually(t, 30*time.Second, "roched to record the end of "+sb.ID, func() bool {
		got, err = rp.InspectEnded(context.Background(), sb.ID)
		if err != nil {
			return false // still running as far as roched knows, or not yet recorded
		}
		// A reason first recorded as unknown (a reconciliation that found the VM gone
		// before the watch's event) is replaced by the event's (docs/ended.md).
		return got.End != nil && got.End.Kind != roche.EndUnknown
	})
	t.Logf("%s ended %v after the kill: %s", sb.ID, time.Since(began).Round(time.Millisecond), got.End)
	if got.State != roche.StateExited || got.End.Kind != roche.EndAgentExited ||
		!strings.Contains(got.End.Evidence, "killed by signal 9 (SIGKILL)") || !strings.Contains(got.End.Evidence, "pid "+strconv.Itoa(qemu)) {
		t.Fatalf("a VM whose QEMU was killed -9 ended %s %+v, want exited, agent_exited with QEMU's kill as evidence", got.State, *got.End)
	}
}
