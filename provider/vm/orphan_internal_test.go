//go:build linux

package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/proctree"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// standIn starts a process whose command line names dir, as a VM's hypervisor's does,
// and records it as dir's hypervisor, with start (its own start time when 0). It is
// killed and reaped when the test ends; the returned channel says when it has exited.
func standIn(t *testing.T, dir string, start uint64) (int, <-chan error) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "while :; do sleep 1; done", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	pid := cmd.Process.Pid
	if start == 0 {
		var err error
		if start, err = proctree.StartTime(pid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, supervisor.HypervisorFile), fmt.Appendf(nil, "%d %d\n", pid, start), 0o600); err != nil {
		t.Fatal(err)
	}
	return pid, exited
}

// TestListKillsOrphanedHypervisor: where the kernel did not kill a VM's hypervisor with
// its supervisor (no PID namespace could be made), List does, once it finds the
// supervisor gone; but only the process the supervisor recorded, never another that
// has the pid since.
func TestListKillsOrphanedHypervisor(t *testing.T) {
	state := t.TempDir()
	p, err := NewQEMU(WithStateDir(state), WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	vmDir := func(id string) string {
		dir := filepath.Join(state, id)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := writeJSON(filepath.Join(dir, "meta.json"), meta{ID: id, Hypervisor: QEMU, Dir: dir}); err != nil {
			t.Fatal(err)
		}
		// Its supervisor is gone: the pid file names no live supervisor of it.
		if err := os.WriteFile(filepath.Join(dir, supervisor.PIDFile), []byte("999999999"), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}

	orphan := vmDir("qemu-" + randomHex(6))
	_, orphanExited := standIn(t, orphan, 0)
	// A pid file whose start time is not that of the process now holding the pid: the
	// hypervisor it named is gone and its pid was reused.
	reused := vmDir("qemu-" + randomHex(6))
	reusedPID, reusedExited := standIn(t, reused, 1)

	if list, err := p.List(context.Background()); err != nil || len(list) != 0 {
		t.Fatalf("List: %v %v, want nothing", list, err)
	}
	select {
	case <-orphanExited:
	case <-time.After(10 * time.Second):
		t.Fatal("List left the orphaned hypervisor running")
	}
	select {
	case err := <-reusedExited:
		t.Fatalf("List killed pid %d, which the record's start time does not name: %v", reusedPID, err)
	case <-time.After(200 * time.Millisecond):
	}
	for _, dir := range []string{orphan, reused} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("List left %s: %v", dir, err)
		}
	}
}
