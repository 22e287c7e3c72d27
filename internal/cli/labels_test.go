package cli

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestLabelsAndSetTimeout, in direct mode: create --metadata labels a sandbox, list
// --metadata/--state selects it, set-timeout shortens its lifetime and it ends then; bad
// labels, states and durations are one-line refusals that make nothing.
func TestLabelsAndSetTimeout(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	job := strconv.FormatInt(time.Now().UnixNano(), 36)
	r := run(t, "create", "--image", testImage(), "--metadata", "job="+job, "--metadata", "user=alice", "--json")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	var made roche.SandboxInfo
	if err := json.Unmarshal([]byte(r.stdout), &made); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run(t, "destroy", made.ID) })
	if made.Metadata["job"] != job || made.Metadata["user"] != "alice" {
		t.Errorf("create --json: metadata %v", made.Metadata)
	}
	list := func(args ...string) []roche.SandboxInfo {
		t.Helper()
		r := run(t, append([]string{"list", "--json"}, args...)...)
		if r.code != 0 {
			t.Fatalf("list %v: %+v", args, r)
		}
		var out []roche.SandboxInfo
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := list("--metadata", "job="+job, "--metadata", "user=alice", "--state", "running"); len(got) != 1 || got[0].ID != made.ID || got[0].Metadata["job"] != job {
		t.Errorf("list --metadata job=%s user=alice --state running: %+v, want only %s", job, got, made.ID)
	}
	if got := list("--metadata", "job="+job, "--metadata", "user=bob"); len(got) != 0 {
		t.Errorf("list --metadata user=bob: %+v, want none", got)
	}
	if got := list("--metadata", "job="+job, "--state", "paused"); len(got) != 0 {
		t.Errorf("list --state paused: %+v, want none", got)
	}

	before := managed(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "--image", testImage(), "--metadata", "roche.owner=cli:root@elsewhere"}, "Roche's own"},
		{[]string{"create", "--image", testImage(), "--metadata", "novalue"}, "use KEY=VALUE"},
		{[]string{"list", "--state", "sleeping"}, "give running, paused, exited or created"},
		{[]string{"set-timeout", made.ID, "soon"}, "give seconds (90) or a duration"},
		{[]string{"set-timeout", made.ID, "0"}, "at least 1 s"},
		{[]string{"set-timeout", made.ID, "25h"}, "over the limit"},
		{[]string{"set-timeout", "0123456789ab", "10"}, "no sandbox"},
	} {
		r := run(t, c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
			t.Errorf("roche %v: exit %d, stderr %q; want one line saying %q", c.args, r.code, r.stderr, c.want)
		}
	}
	if n := managed(t); n != before {
		t.Errorf("the refused creates left %d sandboxes", n-before)
	}

	asked := time.Now()
	r = run(t, "set-timeout", "--json", made.ID, "3s")
	var got roche.SandboxInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil {
		t.Fatalf("set-timeout 3s: %+v", r)
	}
	if d := got.ExpiresAt.Sub(asked); d < 2*time.Second || d > 5*time.Second {
		t.Errorf("set-timeout 3s: expires %s after the call", d)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(list("--metadata", "job="+job)) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox outlived set-timeout 3s by 27 s")
		}
		time.Sleep(250 * time.Millisecond)
	}
}
