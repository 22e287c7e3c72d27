package daemon

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// bearerScript sends one GET to argv[1] with Authorization: Bearer $API_TOKEN and prints
// the status.
const bearerScript = `
import os, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + os.environ['API_TOKEN']})
try:
    print(urllib.request.urlopen(req, timeout=20).status)
except urllib.error.HTTPError as e:
    print(e.code)
`

// secretValue is a secret's value of the test's own, found nowhere else.
func secretValue() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "tok-" + hex.EncodeToString(b)
}

// TestSecretStoreRotationAndTenants: a secret stored in roched (SetSecret) is given to a
// sandbox that names it (Secret.FromStore) and reaches the bound HTTPS host; storing it
// again rotates it in the running sandbox from its next request, as does a
// sandbox-scoped SetSecret. Another tenant cannot take, list, rotate or remove it
// ("not found"). No value is ever in roched's logs (audit included), its state file, the
// command line of any process on the host, or the sandbox's processes' environments.
// The decisions are streamed as events (EgressEvents), to their tenant only.
func TestSecretStoreRotationAndTenants(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	testCA := providertest.UpstreamCA(t)
	srv := providertest.RecordingServer(t, "127.0.0.11", testCA)
	target := srv.Listener.Addr().String()

	v1, v2, v3, vBob := secretValue(), secretValue(), secretValue(), secretValue()

	td := startTenantDaemon(t, Config{}, []string{"alice", "bob"}, nil)
	ctx := ctxFor(t, 3*time.Minute)
	alice, bob := td.client(t, "alice").Client(), td.client(t, "bob").Client()

	if _, err := alice.SetSecret(ctx, "API_TOKEN", v1); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.SetSecret(ctx, "ALICE_ONLY", v1); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.SetSecret(ctx, "API_TOKEN", vBob); err != nil { // bob's own, apart
		t.Fatal(err)
	}
	for _, bad := range []struct{ name, value string }{{"1BAD", "x"}, {"OK", ""}, {"OK", "a\r\nX-Injected: 1"}} {
		if _, err := alice.SetSecret(ctx, bad.name, bad.value); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("SetSecret(%q, %q): %v, want invalid", bad.name, bad.value, err)
		}
	}

	cfg := pyConfig()
	cfg.NetworkAllowlist = []string{target}
	cfg.Secrets = []roche.Secret{{Name: "API_TOKEN", FromStore: true, Hosts: []string{target}, Header: "Authorization"}}
	sb, err := alice.Provider("docker").Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Provider("docker").Destroy(ctx, sb.ID)
	get := func(want string) {
		t.Helper()
		res, err := alice.Provider("docker").Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", bearerScript, "https://" + target + "/v1/x"}})
		if err != nil || strings.TrimSpace(res.Stdout) != "200" {
			t.Fatalf("request from the sandbox: %+v %v", res, err)
		}
		seen := srv.Seen()
		if got := seen[len(seen)-1]; got != "Bearer "+want {
			t.Fatalf("the bound host got %q, want the value stored now", got)
		}
	}
	get(v1)

	// Rotation: the running sandbox sends the new value from its next request.
	rotated, err := alice.SetSecret(ctx, "API_TOKEN", v2)
	if err != nil || !slices.Equal(rotated, []string{sb.ID}) {
		t.Fatalf("rotating: %q %v, want the sandbox rotated", rotated, err)
	}
	get(v2)
	if err := alice.SetSandboxSecret(ctx, sb.ID, "API_TOKEN", v3); err != nil {
		t.Fatal(err)
	}
	get(v3)
	if err := alice.SetSandboxSecret(ctx, sb.ID, "NOPE", v3); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("a secret the sandbox does not have: %v", err)
	}

	// Another tenant: its own store, never alice's.
	bcfg := pyConfig()
	bcfg.NetworkAllowlist = []string{target}
	bcfg.Secrets = []roche.Secret{{Name: "ALICE_ONLY", FromStore: true, Hosts: []string{target}}}
	if _, err := bob.Provider("docker").Create(ctx, bcfg); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob creating with alice's stored secret: %v, want not found", err)
	}
	if err := bob.SetSandboxSecret(ctx, sb.ID, "API_TOKEN", vBob); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob rotating alice's sandbox's secret: %v, want not found", err)
	}
	if err := bob.RemoveSecret(ctx, "ALICE_ONLY"); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob removing alice's secret: %v, want not found", err)
	}
	if ss, err := bob.ListSecrets(ctx); err != nil || len(ss) != 1 || ss[0].Name != "API_TOKEN" || len(ss[0].Sandboxes) != 0 {
		t.Fatalf("bob's secrets: %+v %v, want his API_TOKEN only, used by none", ss, err)
	}
	if rotated, err := bob.SetSecret(ctx, "API_TOKEN", vBob); err != nil || len(rotated) != 0 {
		t.Fatalf("bob storing his API_TOKEN again rotated %q %v: alice's sandbox is not his", rotated, err)
	}
	get(v3)
	if _, err := bob.EgressLog(ctx, sb.ID, 0); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob reading alice's egress log: %v", err)
	}
	if err := bob.EgressEvents(ctx, sb.ID, 0, func(egress.Decision, uint64) error { return nil }); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob following alice's egress events: %v", err)
	}
	ss, err := alice.ListSecrets(ctx)
	if err != nil || len(ss) != 2 || ss[0].Name != "ALICE_ONLY" || ss[1].Name != "API_TOKEN" || !slices.Equal(ss[1].Sandboxes, []string{sb.ID}) {
		t.Fatalf("alice's secrets: %+v %v", ss, err)
	}
	if err := alice.RemoveSecret(ctx, "ALICE_ONLY"); err != nil {
		t.Fatal(err)
	}

	// Events: the final decisions so far (a CONNECT and a request inside it per get),
	// replayed, then one made while following.
	var got []egress.Decision
	errEnough := errors.New("enough")
	follow, replayed := make(chan error, 1), make(chan struct{})
	go func() {
		gets := 0
		follow <- alice.EgressEvents(ctx, sb.ID, 0, func(d egress.Decision, _ uint64) error {
			got = append(got, d)
			if d.Method == "GET" {
				gets++
			}
			if gets == 4 && d.Method == "GET" {
				close(replayed)
			}
			if gets == 5 {
				return errEnough
			}
			return nil
		})
	}()
	select {
	case <-replayed:
	case err := <-follow:
		t.Fatalf("following ended before the replay: %v", err)
	}
	get(v3)
	if err := <-follow; !errors.Is(err, errEnough) {
		t.Fatalf("following: %v", err)
	}
	var gets int
	for _, d := range got {
		if d.Method == "GET" && d.Allowed && d.Path == "/v1/x" && d.Tenant == "alice" {
			gets++
		}
	}
	if gets != 5 {
		t.Fatalf("events: %d allowed GETs, want 5 (4 replayed, 1 live): %+v", gets, got)
	}

	// Where the values must never be.
	res, err := alice.Provider("docker").Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"}})
	if err != nil || !strings.Contains(res.Stdout, "API_TOKEN=roche-secret-") {
		t.Fatalf("the sandbox's environment: %+v %v", res, err)
	}
	places := map[string][]byte{"the sandbox's environment": []byte(res.Stdout), "roched's logs": []byte(td.logs.String())}
	if b, err := os.ReadFile(td.d.cfg.StateFile); err == nil {
		places["the state file"] = b
	} else {
		t.Fatalf("reading the state file: %v", err)
	}
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var ps []byte
	for _, f := range cmdlines {
		b, _ := os.ReadFile(f)
		ps = append(ps, b...)
	}
	if len(ps) == 0 {
		t.Fatal("read no command lines")
	}
	places["the host's command lines"] = ps
	if !strings.Contains(td.logs.String(), `"op":"secret_set"`) {
		t.Fatal("no secret_set audit line")
	}
	for where, b := range places {
		for _, v := range []string{v1, v2, v3, vBob} {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("a secret's value is in %s", where)
			}
		}
	}
}
