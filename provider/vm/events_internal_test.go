//go:build linux

package vm

import (
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// TestEndEvents checks what the watch of a VM says of each end its supervisor records.
func TestEndEvents(t *testing.T) {
	at := time.UnixMilli(1_800_000_000_000)
	for _, c := range []struct {
		name  string
		rec   *supervisor.Ended
		kinds []kit.SandboxEventKind
		want  string
	}{
		{"no record", nil, []kit.SandboxEventKind{kit.EventDied}, "supervisor (pid 7) exited without recording"},
		{"killed", &supervisor.Ended{HypervisorPID: 9, Signal: 9}, []kit.SandboxEventKind{kit.EventDied},
			"qemu (pid 9) was killed by signal 9 (SIGKILL) from outside the VM"},
		{"powered off", &supervisor.Ended{HypervisorPID: 9, ExitKnown: true}, []kit.SandboxEventKind{kit.EventDied},
			"qemu (pid 9) exited with status 0: the guest powered off or rebooted"},
		{"agent exited", &supervisor.Ended{HypervisorPID: 9, ExitKnown: true, Panic: "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100"},
			[]kit.SandboxEventKind{kit.EventDied}, `after the guest kernel panicked: "Kernel panic - not syncing: Attempted to kill init!`},
		{"guest out of memory", &supervisor.Ended{HypervisorPID: 9, ExitKnown: true, Panic: "Kernel panic - not syncing: Out of memory and no killable processes..."},
			[]kit.SandboxEventKind{kit.EventOOM, kit.EventDied}, "Out of memory and no killable processes"},
		{"destroyed after a command's OOM kill", &supervisor.Ended{HypervisorPID: 9, Stopped: "stopped by terminated", OOM: "Out of memory: Killed process 40 (python3)"},
			[]kit.SandboxEventKind{kit.EventDied}, "its supervisor stopped by terminated, which stopped qemu (pid 9); the guest kernel's last OOM kill"},
	} {
		if c.rec != nil {
			c.rec.AtUnixMS = at.UnixMilli()
		}
		evs := endEvents("qemu-1", "qemu", 7, c.rec, at)
		var kinds []kit.SandboxEventKind
		for _, ev := range evs {
			kinds = append(kinds, ev.Kind)
			if !ev.Time.Equal(at) || ev.ID != "qemu-1" {
				t.Errorf("%s: event %+v, want sandbox qemu-1 at %v", c.name, ev, at)
			}
		}
		if len(kinds) != len(c.kinds) || strings.Join(kindStrings(kinds), ",") != strings.Join(kindStrings(c.kinds), ",") {
			t.Errorf("%s: events %v, want %v", c.name, kinds, c.kinds)
			continue
		}
		if died := evs[len(evs)-1]; !strings.Contains(died.Evidence, c.want) {
			t.Errorf("%s: evidence %q, want it to say %q", c.name, died.Evidence, c.want)
		}
	}
}

func kindStrings(ks []kit.SandboxEventKind) []string {
	var out []string
	for _, k := range ks {
		out = append(out, string(k))
	}
	return out
}
