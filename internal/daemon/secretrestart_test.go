package daemon

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// envBearerScript sends one GET to argv[1] with Authorization: Bearer $argv[2] and
// prints the status, then the body of a refusal.
const envBearerScript = `
import os, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + os.environ[sys.argv[2]]})
try:
    print(urllib.request.urlopen(req, timeout=20).status)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode(errors='replace').strip())
`

// TestSecretRotationAcrossRestartAndReset, through real roched processes: roched keeps
// secret values in memory only, so a roched killed and started again has none, and the
// sandbox's requests carrying the placeholder are refused, saying to set it again. Then
// storing the secret again reaches the sandbox that took it from the store (its binding
// is recorded with the sandbox, not its value), whether its proxy is running again
// already or starts after the value is stored. A sandbox Reset from it gets the values
// its proxy held (a secret given as a value too) and follows the store's rotation.
func TestSecretRotationAcrossRestartAndReset(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	testCA := providertest.UpstreamCA(t) // the roched processes trust it too
	srv := providertest.RecordingServer(t, "127.0.0.12", testCA)
	target := srv.Listener.Addr().String()
	v1, v2, v3, v4, vFile := secretValue(), secretValue(), secretValue(), secretValue(), secretValue()

	socket := filepath.Join(shortDir(t), "roched.sock")
	ctx := ctxFor(t, 4*time.Minute)
	var current *roched
	var c *client.Client
	start := func() {
		t.Helper()
		if current != nil {
			current.cmd.Process.Signal(syscall.SIGKILL)
			current.cmd.Wait()
			c.Close()
		}
		current = startRoched(t, socket)
		var err error
		if c, err = client.New(client.WithSocket(socket)); err != nil {
			t.Fatal(err)
		}
	}
	start()
	var made []string
	defer func() {
		for _, id := range made {
			c.Provider("docker").Destroy(context.Background(), id)
		}
		c.Close()
	}()
	// send makes one request from sandbox id with the placeholder of env; it returns
	// the status line, and the Authorization the server got if it got one.
	send := func(id, env string) (string, string) {
		t.Helper()
		before := len(srv.Seen())
		res, err := c.Provider("docker").Exec(ctx, id, roche.ExecRequest{Cmd: []string{"python3", "-c", envBearerScript, "https://" + target + "/v1/x", env}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("request from the sandbox: %+v %v\n%s", res, err, current.log)
		}
		seen := srv.Seen()
		if len(seen) > before {
			return strings.TrimSpace(res.Stdout), seen[len(seen)-1]
		}
		return strings.TrimSpace(res.Stdout), ""
	}
	expect := func(id, env, want string) {
		t.Helper()
		if status, got := send(id, env); status != "200" || got != "Bearer "+want {
			t.Fatalf("%s from %s: %q, the server got %q; want the value %s", env, id, status, got, want)
		}
	}

	if _, err := c.SetSecret(ctx, "API_TOKEN", v1); err != nil {
		t.Fatal(err)
	}
	cfg := pyConfig()
	cfg.NetworkAllowlist = []string{target}
	cfg.Secrets = []roche.Secret{
		{Name: "API_TOKEN", FromStore: true, Hosts: []string{target}, Header: "Authorization"},
		{Name: "FILE_TOKEN", Value: vFile, Hosts: []string{target}, Header: "Authorization"},
	}
	sb, err := c.Provider("docker").Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	made = append(made, sb.ID)
	expect(sb.ID, "API_TOKEN", v1)

	// A restart: no value until it is stored again.
	start()
	if status, got := send(sb.ID, "API_TOKEN"); !strings.HasPrefix(status, "403 ") || !strings.Contains(status, "set it again") || got != "" {
		t.Fatalf("after a restart, before the value is stored again: %q, the server got %q; want 403 saying to set it again", status, got)
	}
	rotated, err := c.SetSecret(ctx, "API_TOKEN", v2)
	if err != nil || !slices.Equal(rotated, []string{sb.ID}) {
		t.Fatalf("storing it again after a restart rotated %q (%v), want the sandbox made before", rotated, err)
	}
	expect(sb.ID, "API_TOKEN", v2)
	if ss, err := c.ListSecrets(ctx); err != nil || len(ss) != 1 || !slices.Equal(ss[0].Sandboxes, []string{sb.ID}) {
		t.Fatalf("the stored secrets after a restart: %+v %v, want API_TOKEN used by %s", ss, err, sb.ID)
	}

	// Another restart, the value stored before anything brings the sandbox's proxy
	// back: the proxy gets it when it starts.
	start()
	if _, err := c.SetSecret(ctx, "API_TOKEN", v3); err != nil {
		t.Fatal(err)
	}
	expect(sb.ID, "API_TOKEN", v3)

	// Reset: the sandbox made again follows the store, and keeps the value it was given.
	if err := c.SetSandboxSecret(ctx, sb.ID, "FILE_TOKEN", vFile); err != nil {
		t.Fatal(err)
	}
	reset, err := c.Provider("docker").Reset(ctx, sb.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	made = append(made, reset.ID)
	expect(reset.ID, "API_TOKEN", v3)
	expect(reset.ID, "FILE_TOKEN", vFile)
	rotated, err = c.SetSecret(ctx, "API_TOKEN", v4)
	if err != nil || !slices.Equal(rotated, []string{reset.ID}) {
		t.Fatalf("rotating after a reset: %q %v, want the sandbox reset", rotated, err)
	}
	expect(reset.ID, "API_TOKEN", v4)
}
