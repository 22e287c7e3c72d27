package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestSecretThroughRoched: roche create --secret NAME=@FILE --secret-host through
// roched (the value crosses the API, never argv): the sandbox's NAME holds a
// placeholder, the bound HTTPS host (on loopback, its certificate from a test CA given
// by ROCHE_EGRESS_ROOTS) gets the value, and neither the sandbox nor the log shows it.
func TestSecretThroughRoched(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	testCA := providertest.UpstreamCA(t)
	dir := t.TempDir()
	srv := providertest.RecordingServer(t, "127.0.0.10", testCA)
	target := srv.Listener.Addr().String()

	const value = "tok-9c1f2e3d4b5a6978"
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := daemontest.Serve(t, daemon.Config{})
	t.Setenv("ROCHE_SOCKET", s.Socket)
	r := run(t, "create", "--image", testImage(), "--allow-host", "GET https://"+target+"/v1/",
		"--secret", "API_TOKEN=@"+file, "--secret-host", "API_TOKEN="+target, "--secret-header", "API_TOKEN=Authorization")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 {
		t.Fatalf("create --secret: %+v", r)
	}
	t.Cleanup(func() { run(t, "destroy", id) })
	r = run(t, "exec", "--sandbox", id, "--", "python3", "-c", `import os, sys, urllib.request
tok = os.environ['API_TOKEN']
req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + tok})
print(tok, urllib.request.urlopen(req, timeout=20).read().decode())`, "https://"+target+"/v1/x")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "roche-secret-") || !strings.HasSuffix(r.stdout, " upstream GET /v1/x\n") || strings.Contains(r.stdout, value) {
		t.Fatalf("exec: %+v, want the placeholder and the upstream's answer", r)
	}
	if got := srv.Seen(); len(got) != 1 || got[0] != "Bearer "+value {
		t.Fatalf("the bound host got %q, want the secret's value", got)
	}
	r = run(t, "egress", "log", "--json", id)
	if r.code != 0 || !strings.Contains(r.stdout, `"path":"/v1/x"`) || strings.Contains(r.stdout, value) {
		t.Fatalf("egress log: %+v", r)
	}
}
