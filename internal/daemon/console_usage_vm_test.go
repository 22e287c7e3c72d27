package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/vm"
)

// TestConsoleUsageQEMU: the console's live figures of a microVM through roched's
// /ui/api/usage, read by the VM's roche-agent from its guest kernel over the VM's link:
// the VM's memory, its tasks and its CPU time, which a command burning CPU in it makes
// grow between two readings.
func TestConsoleUsageQEMU(t *testing.T) {
	testenv.Needs(t, testenv.QEMU, testenv.Root, testenv.Docker)
	p, err := vm.NewQEMU(vm.WithStateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 3*time.Minute)
	c, base, token := consoleWith(ctx, t, vm.QEMU, p)
	sb, err := c.Provider(vm.QEMU).Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Provider(vm.QEMU).Destroy(context.WithoutCancel(ctx), sb.ID)
	usage := func() kit.Usage {
		t.Helper()
		u, ok := consoleUsage(ctx, t, base, token)[sb.ID]
		if !ok || u.MemoryLimitBytes <= 0 || u.MemoryBytes <= 0 || u.Processes < 1 || u.CPUTime <= 0 {
			t.Fatalf("the console's usage of qemu sandbox %s: %+v (found: %v); want the VM's memory and its total, tasks and CPU time", sb.ID, u, ok)
		}
		return u
	}
	before := usage()
	res, err := c.Provider(vm.QEMU).Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c",
		"import time\nt=time.process_time()\nwhile time.process_time()-t<0.5: pass"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	after := usage()
	t.Logf("before: %+v; after burning 0.5 s: %+v", before, after)
	if burnt := after.CPUTime - before.CPUTime; burnt < 300*time.Millisecond {
		t.Errorf("the VM's CPU time grew by %v over a command that burnt 0.5 s", burnt)
	}
}
