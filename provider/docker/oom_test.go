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
	if got := execOK(t, p, id, "cat", "/proc/self/oom_score_adj"); got != "1000\n" {
		t.Fatalf("a command's oom_score_adj: %q, want 1000", got)
	}
}
