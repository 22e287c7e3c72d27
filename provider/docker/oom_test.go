package docker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// TestFullTmpfsSparesTheAgent: memory a program leaves in /tmp and /dev/shm belongs to no
// process, so killing a small one that filled them (head here) would win none of it
// back, and the agent, the biggest process left, would be killed next and the sandbox
// with it. Under memory=128m the mounts are sized (Config.TmpSize) so that filling both
// gets ENOSPC, and the agent and the next command still have room; the files API frees
// it. Commands are the OOM killer's first choice over the agent.
func TestFullTmpfsSparesTheAgent(t *testing.T) {
	p := newProvider(t)
	cfg := testConfig()
	cfg.Memory = "128m"
	id := sandbox(t, p, cfg)
	ctx := context.Background()
	res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"sh", "-c",
		"head -c 100M /dev/zero > /tmp/fill; a=$?; head -c 100M /dev/zero > /dev/shm/fill; echo $a $?; du -m /tmp/fill /dev/shm/fill"},
		Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("filling the tmpfs mounts: %v (did the sandbox's agent die?)", err)
	}
	if want := "1 1\n48\t/tmp/fill\n48\t/dev/shm/fill\n"; res.ExitCode != 0 || res.OOMKilled || res.Stdout != want ||
		strings.Count(res.Stderr, "No space left on device") != 2 {
		t.Fatalf("filling the tmpfs mounts under memory=128m: %+v, want both refused with ENOSPC at 48 MiB (%q), no OOM kill", res, want)
	}
	if got := execOK(t, p, id, "python3", "-c", "print('alive')"); got != "alive\n" {
		t.Fatalf("with both tmpfs mounts full: %q", got)
	}
	for _, f := range []string{"/tmp/fill", "/dev/shm/fill"} {
		if err := p.Remove(ctx, id, f); err != nil {
			t.Fatalf("removing %s through the agent: %v", f, err)
		}
	}
	// The agent raises a command's score just after it starts (Go has no hook between fork
	// and exec), so a command reading its own at once may still see the agent's: the
	// shell's is read a second in, and cat's, started by it then, shows it is inherited.
	if got := execOK(t, p, id, "sh", "-c", "sleep 1; cat /proc/$$/oom_score_adj /proc/self/oom_score_adj"); got != "1000\n1000\n" {
		t.Fatalf("the oom_score_adj of a command and of what it starts: %q, want 1000 for both", got)
	}
}
