package server

import (
	"os"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
)

// TestTasksOfCountsThreads checks the count the pids evidence rests on: every thread of
// this process is a task of its uid (the kernel counts threads against RLIMIT_NPROC).
func TestTasksOfCountsThreads(t *testing.T) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := tasksOf(os.Getuid()); !ok || n < len(ents) {
		t.Fatalf("tasksOf(%d) = %d, %v; this process alone has %d threads", os.Getuid(), n, ok, len(ents))
	}
	if n, ok := tasksOf(1 << 30); !ok || n != 0 {
		t.Fatalf("tasksOf an unused uid = %d, %v, want 0", n, ok)
	}
}

// TestEndOfPids checks which end a command's receipt gives against the sandbox's
// process limit as counted when it ended.
func TestEndOfPids(t *testing.T) {
	none := counts{oom: -1}
	full := procLimit{ok: true, tasks: 19, limit: 20, uid: 1000, reaped: true}
	room := procLimit{ok: true, tasks: 12, limit: 20, uid: 1000, reaped: true}
	for _, c := range []struct {
		name     string
		exit     int
		timedOut bool
		limit    procLimit
		want     string
		evidence string
	}{
		{"failed at the limit", 1, false, full, "pids", "exit 1 with the sandbox at its process limit (RLIMIT_NPROC 20): 19 processes and threads of uid 1000 still running in /proc when it was reaped, with it 20"},
		{"failed with room", 1, false, room, "", ""},
		{"succeeded at the limit", 0, false, full, "", ""},
		{"no limit", 1, false, procLimit{}, "", ""},
		{"timed out at the limit", 137, true, procLimit{ok: true, tasks: 20, limit: 20, uid: 1000},
			"command_timeout", "killed by roche-agent at its timeout of 2s, with the sandbox at its process limit (RLIMIT_NPROC 20): 20 processes and threads of uid 1000 running in /proc"},
		{"timed out with room", 137, true, procLimit{ok: true, tasks: 3, limit: 20, uid: 1000},
			"command_timeout", "killed by roche-agent at its timeout of 2s"},
	} {
		end, ev := endOf(guest.Result{ExitCode: c.exit}, c.timedOut, false, none, c.limit, 2*time.Second, 0)
		if end != c.want || ev != c.evidence {
			t.Errorf("%s: end %q (%q), want %q (%q)", c.name, end, ev, c.want, c.evidence)
		}
	}
}
