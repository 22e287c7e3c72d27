package docker_test

import (
	"context"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// TestOOMInTmpfsSparesTheAgent: memory a small program leaves in /tmp and /dev/shm belongs
// to no process, so the OOM killer would otherwise pick the biggest one, roche-agent,
// and end the sandbox; commands are its first choice instead, their kill is reported,
// and the agent still answers, so the files API can free the memory.
func TestOOMInTmpfsSparesTheAgent(t *testing.T) {
	p := newProvider(t)
	cfg := testConfig()
	cfg.Memory = "128m"
	id := sandbox(t, p, cfg)
	ctx := context.Background()
	res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"sh", "-c",
		"head -c 100M /dev/zero > /tmp/fill; head -c 100M /dev/zero > /dev/shm/fill"}, Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("filling the tmpfs mounts: %v (did the sandbox's agent die?)", err)
	}
	if res.ExitCode != 137 || !res.OOMKilled {
		t.Fatalf("filling the tmpfs mounts under memory=128m: %+v, want exit 137, OOMKilled", res)
	}
	for _, f := range []string{"/tmp/fill", "/dev/shm/fill"} {
		if err := p.Remove(ctx, id, f); err != nil {
			t.Fatalf("removing %s through the agent: %v", f, err)
		}
	}
	if got := execOK(t, p, id, "python3", "-c", "print('alive')"); got != "alive\n" {
		t.Fatalf("after the OOM kill: %q", got)
	}
	// The agent raises a command's score just after it starts (Go has no hook between fork
	// and exec), so a command reading its own at once may still see the agent's: the
	// shell's is read a second in, and cat's, started by it then, shows it is inherited.
	if got := execOK(t, p, id, "sh", "-c", "sleep 1; cat /proc/$$/oom_score_adj /proc/self/oom_score_adj"); got != "1000\n1000\n" {
		t.Fatalf("the oom_score_adj of a command and of what it starts: %q, want 1000 for both", got)
	}
}
