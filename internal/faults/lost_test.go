package faults

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
)

// TestGuardHoldsWithoutTheStateFile does what the fault matrix did: roched, whose state
// file is not beside its socket (--state), hands a pooled sandbox with its own env and
// workdir to a client and is killed outright. roche exec on that sandbox must not run
// it directly, silently without them: it refuses, naming roched and --direct, whether
// the state file beside the socket is missing, corrupt or unreadable (a directory in its
// place). The sandbox itself says it is roched's. --direct still acts on it, and shows
// what acting directly drops.
func TestGuardHoldsWithoutTheStateFile(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	rd := startRochedProc(t, "--pool", "docker/"+img+"?min=1&max=1")
	eventually(t, time.Minute, "the pool to fill", func() bool {
		idle, creating, _ := rd.poolCounts(t)
		return idle == 1 && creating == 0
	})
	cfg := roche.DefaultConfig()
	cfg.Image = img
	cfg.Env = map[string]string{"FROM_POOL": "yes"}
	cfg.Workdir = "/tmp/wd"
	sb, pooled, err := rd.c.Create(context.Background(), "docker", cfg)
	if err != nil || !pooled {
		t.Fatalf("create through roched: pooled %v, %v; want one from the pool", pooled, err)
	}
	defer real.Destroy(context.Background(), sb.ID)
	// Killed mid-refill is TestRochedKilledDuringRefill's: here the pool is full again.
	eventually(t, time.Minute, "the pool to refill", func() bool {
		idle, creating, _ := rd.poolCounts(t)
		return idle == 1 && creating == 0
	})
	rd.kill(t)

	beside := client.StateFile(rd.socket)
	env := []string{"ROCHE_SOCKET=" + rd.socket}
	want := "sandbox " + sb.ID + " is managed by roched, which is not answering on " + rd.socket +
		": start it (roche daemon start) or pass --direct to act on it without its env and workdir"
	for _, c := range []struct {
		name  string
		setUp func() error
	}{
		{"no state file beside the socket", func() error { return nil }},
		{"a corrupt one", func() error { return os.WriteFile(beside, []byte(`{"version":1,"sandboxes":[{"id":"`), 0o600) }},
		{"an unreadable one", func() error { os.Remove(beside); return os.Mkdir(beside, 0o700) }},
	} {
		if err := c.setUp(); err != nil {
			t.Fatal(err)
		}
		r := runRoche(t, env, "exec", "--sandbox", sb.ID, "--", "sh", "-c", "echo ${FROM_POOL:-unset} $PWD")
		if r.code == 0 || !strings.Contains(r.stderr, want) || strLines(r.stderr) != 1 {
			t.Errorf("%s: roche exec with roched killed: %+v, want one line saying %q", c.name, r, want)
		}
	}
	r := runRoche(t, env, "--direct", "exec", "--sandbox", sb.ID, "--", "sh", "-c", "echo ${FROM_POOL:-unset}")
	if r.code != 0 || r.stdout != "unset\n" {
		t.Errorf("roche --direct exec: %+v, want it run without the pool's env", r)
	}
	if err := real.Destroy(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, real, img, 30*time.Second)
}
