package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestEgressLearn: a task run in a sandbox made with --egress-learn and no allowlist
// reaches nothing (learn mode opens no network); roche egress suggest then prints the
// entries it needed, which let the same task pass in a new sandbox, and nothing more (a
// third host stays refused). In direct mode --egress-learn is refused: only roched keeps
// what a sandbox needed.
func TestEgressLearn(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	hostA, hostB, hostC := providertest.OKServer(t, "127.0.0.21"), providertest.OKServer(t, "127.0.0.22"), providertest.OKServer(t, "127.0.0.23")
	task := []string{"http://" + hostA + "/simple/", "http://" + hostB + "/files/x.whl"}
	s := daemontest.Serve(t, daemon.Config{})
	t.Setenv("ROCHE_SOCKET", s.Socket)
	create := func(args ...string) string {
		t.Helper()
		r := run(t, append([]string{"create", "--image", testImage()}, args...)...)
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create %q: %+v", args, r)
		}
		t.Cleanup(func() { run(t, "destroy", id) })
		return id
	}
	runTask := func(id string, urls ...string) string {
		t.Helper()
		r := run(t, append([]string{"exec", "--sandbox", id, "--", "python3", "-c", providertest.GetEach}, urls...)...)
		if r.code != 0 {
			t.Fatalf("task: %+v", r)
		}
		return strings.TrimSpace(r.stdout)
	}

	learner := create("--egress-learn")
	if got := runTask(learner, task...); got != "403 403" {
		t.Fatalf("the task in learn mode got %q, want both refused: learn mode opens nothing", got)
	}
	r := run(t, "egress", "suggest", learner)
	suggested := strings.Fields(r.stdout)
	if r.code != 0 || strings.Join(suggested, " ") != hostA+" "+hostB {
		t.Fatalf("egress suggest: %+v, want %s and %s", r, hostA, hostB)
	}

	var allow []string
	for _, e := range suggested {
		allow = append(allow, "--allow-host", e)
	}
	second := create(allow...)
	if got := runTask(second, task...); got != "200 200" {
		t.Fatalf("the task with the suggested entries got %q, want it to pass", got)
	}
	if got := runTask(second, "http://"+hostC+"/"); got != "403" {
		t.Fatalf("a third host with the suggested entries got %q, want refused", got)
	}

	r = run(t, "create", "--direct", "--image", testImage(), "--egress-learn")
	if id := strings.TrimSpace(r.stdout); id != "" {
		run(t, "destroy", "--direct", id)
	}
	if r.code == 0 || !strings.Contains(r.stderr, "needs roched") {
		t.Fatalf("create --direct --egress-learn: %+v, want refused", r)
	}
}

// TestSecretStoreCommands: roche secret set (from standard input), list, create --secret
// NAME from the store, and set again rotating the running sandbox's value, which the
// bound host then gets; the value is never on a command line or in the output.
func TestSecretStoreCommands(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	testCA := providertest.UpstreamCA(t)
	dir := t.TempDir()
	srv := providertest.RecordingServer(t, "127.0.0.12", testCA)
	target := srv.Listener.Addr().String()
	s := daemontest.Serve(t, daemon.Config{})
	t.Setenv("ROCHE_SOCKET", s.Socket)

	const v1, v2 = "tok-store-5a1e0c7d", "tok-store-9b2f1d8e"
	if r := rocheIn(t, v1+"\n", "secret", "set", "API_TOKEN"); r.code != 0 || r.stdout != "" {
		t.Fatalf("secret set: %+v", r)
	}
	r := run(t, "create", "--image", testImage(), "--allow-host", target,
		"--secret", "API_TOKEN", "--secret-host", "API_TOKEN="+target, "--secret-header", "API_TOKEN=Authorization")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 {
		t.Fatalf("create --secret NAME: %+v", r)
	}
	t.Cleanup(func() { run(t, "destroy", id) })
	get := func(want string) {
		t.Helper()
		r := run(t, "exec", "--sandbox", id, "--", "python3", "-c", `import os, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + os.environ['API_TOKEN']})
print(urllib.request.urlopen(req, timeout=20).read().decode())`, "https://"+target+"/v1/x")
		seen := srv.Seen()
		if r.code != 0 || len(seen) == 0 || seen[len(seen)-1] != "Bearer "+want {
			t.Fatalf("exec: %+v, the host got %q, want %q", r, seen, want)
		}
	}
	get(v1)
	if r := run(t, "secret", "list"); r.code != 0 || !strings.Contains(r.stdout, "API_TOKEN") || !strings.Contains(r.stdout, id) || strings.Contains(r.stdout, v1) {
		t.Fatalf("secret list: %+v", r)
	}
	file := filepath.Join(dir, "v2")
	if err := os.WriteFile(file, []byte(v2), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "secret", "set", "API_TOKEN", "--from-file", file); r.code != 0 || strings.TrimSpace(r.stdout) != id {
		t.Fatalf("secret set again: %+v, want the sandbox rotated", r)
	}
	get(v2)
	if r := run(t, "secret", "rm", "API_TOKEN"); r.code != 0 {
		t.Fatalf("secret rm: %+v", r)
	}
	if r := run(t, "secret", "rm", "API_TOKEN"); r.code == 0 || !strings.Contains(r.stderr, "not in roched's secret store") {
		t.Fatalf("secret rm twice: %+v", r)
	}
	r = run(t, "create", "--image", testImage(), "--allow-host", target, "--secret", "API_TOKEN", "--secret-host", "API_TOKEN="+target)
	if r.code == 0 || !strings.Contains(r.stderr, "roche secret set API_TOKEN") {
		t.Fatalf("create with a secret not stored: %+v", r)
	}
}

// TestSecretListJSON: roche secret list --json, which the SDKs read, names each stored
// secret with when it was set and the sandboxes using it (none here), never its value;
// rm of a name never stored says so.
func TestSecretListJSON(t *testing.T) {
	s := daemontest.Serve(t, daemon.Config{}) // needs Docker, as roched runs; no sandbox is made
	t.Setenv("ROCHE_SOCKET", s.Socket)
	const v = "tok-list-json-4c2d9e"
	before := time.Now().Add(-time.Minute)
	for _, name := range []string{"B_TOKEN", "A_TOKEN"} {
		if r := rocheIn(t, v+"\n", "secret", "set", name); r.code != 0 {
			t.Fatalf("secret set %s: %+v", name, r)
		}
	}
	r := run(t, "secret", "list", "--json")
	var got []struct {
		Name      string    `json:"name"`
		Updated   time.Time `json:"updated"`
		Sandboxes []string  `json:"sandboxes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil || strings.Contains(r.stdout, v) {
		t.Fatalf("secret list --json: %+v (%v)", r, err)
	}
	if len(got) != 2 || got[0].Name != "A_TOKEN" || got[1].Name != "B_TOKEN" || got[0].Updated.Before(before) ||
		got[0].Sandboxes == nil || len(got[0].Sandboxes) != 0 {
		t.Fatalf("secret list --json = %+v, want A_TOKEN and B_TOKEN, just set, used by no sandbox", got)
	}
	if r := run(t, "secret", "rm", "A_TOKEN"); r.code != 0 {
		t.Fatalf("secret rm: %+v", r)
	}
	if r := run(t, "secret", "list", "--json"); r.code != 0 || !strings.Contains(r.stdout, `"B_TOKEN"`) || strings.Contains(r.stdout, "A_TOKEN") {
		t.Fatalf("secret list --json after rm: %+v", r)
	}
	if r := run(t, "secret", "rm", "NEVER_SET"); r.code == 0 || !strings.Contains(r.stderr, "not in roched's secret store") {
		t.Fatalf("secret rm of a name never stored: %+v", r)
	}
	if r := run(t, "secret", "list"); r.code != 0 || !strings.HasPrefix(r.stdout, "NAME") {
		t.Fatalf("secret list: %+v", r)
	}
}
