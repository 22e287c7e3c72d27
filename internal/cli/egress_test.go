package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestEgressCommands: roche egress log --json, suggest, allow and deny on a real sandbox
// through roched; suggest's output, given to allow, lets the refused request through.
func TestEgressCommands(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	allowed, needed := providertest.OKServer(t, "127.0.0.8"), providertest.OKServer(t, "127.0.0.9")
	s := daemontest.Serve(t, daemon.Config{})
	t.Setenv("ROCHE_SOCKET", s.Socket)
	r := run(t, "create", "--image", testImage(), "--allow-host", allowed)
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 {
		t.Fatalf("create --allow-host: %+v", r)
	}
	t.Cleanup(func() { run(t, "destroy", id) })
	get := func(target string) string {
		t.Helper()
		r := run(t, "exec", "--sandbox", id, "--", "python3", "-c",
			"import sys, urllib.request, urllib.error\ntry: print(urllib.request.urlopen(sys.argv[1], timeout=10).status)\nexcept urllib.error.HTTPError as e: print(e.code)",
			"http://"+target+"/p")
		return strings.TrimSpace(r.stdout)
	}
	if a, b := get(allowed), get(needed); a != "200" || b != "403" {
		t.Fatalf("before: %s %s, want 200 403", a, b)
	}

	r = run(t, "egress", "log", "--json", id)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 {
		t.Fatalf("egress log --json: %+v", r)
	}
	var ds []egress.Decision
	for _, l := range lines {
		var d egress.Decision
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		ds = append(ds, d)
	}
	if !ds[0].Allowed || ds[0].Target() != allowed || ds[0].Tenant == "" || ds[1].Allowed || ds[1].Rule != needed || ds[1].Path != "/p" {
		t.Fatalf("decisions: %+v", ds)
	}
	if r := run(t, "egress", "log", id); r.code != 0 || !strings.Contains(r.stdout, "refused") || !strings.Contains(r.stdout, "not in this sandbox's allowlist") {
		t.Fatalf("egress log: %+v", r)
	}
	r = run(t, "egress", "suggest", id)
	if r.code != 0 || r.stdout != needed+"\n" {
		t.Fatalf("egress suggest: %+v, want %s", r, needed)
	}
	if r := run(t, "egress", "allow", id, strings.TrimSpace(r.stdout)); r.code != 0 || r.stdout != allowed+"\n"+needed+"\n" {
		t.Fatalf("egress allow: %+v", r)
	}
	if got := get(needed); got != "200" {
		t.Fatalf("after egress allow: %s", got)
	}
	if r := run(t, "egress", "deny", id, needed); r.code != 0 || r.stdout != allowed+"\n" {
		t.Fatalf("egress deny: %+v", r)
	}
	if got := get(needed); got != "403" {
		t.Fatalf("after egress deny: %s", got)
	}
	if r := run(t, "egress", "deny", id, "http://x/"); r.code == 0 || !strings.Contains(r.stderr, "not a URL") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Fatalf("egress deny of a bad entry: %+v, want a one-line error", r)
	}
}
