package e2b_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
)

const (
	acmeKey  = "e2b_00112233445566778899aabbccddeeff00112233"
	otherKey = "e2b_ffeeddccbbaa99887766554433221100ffeeddcc"
)

type reply struct {
	status int
	body   string
}

func call(t *testing.T, method, url string, header map[string]string, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if body != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(b)}
}

// e2bError checks that a refusal is E2B's {code, message} with the given status.
func e2bError(t *testing.T, what string, r reply, status int) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if r.status != status || json.Unmarshal([]byte(r.body), &e) != nil || e.Code != status || e.Message == "" {
		t.Errorf("%s: got %d %s, want %d with E2B's {code, message}", what, r.status, r.body, status)
	}
}

// TestTenantsApart attacks one tenant's sandbox from another tenant, with forged ids and
// with stolen or missing access tokens, through the E2B listener, and checks that each
// attempt is refused and the sandbox untouched.
func TestTenantsApart(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	s := serve(t, daemon.Config{Tenants: []daemon.Tenant{
		{Name: "acme", TokenSHA256: daemon.HashToken(acmeKey)},
		{Name: "other", TokenSHA256: daemon.HashToken(otherKey)},
	}})
	url := s.env["E2B_API_URL"]
	acme := map[string]string{"X-API-Key": acmeKey}
	other := map[string]string{"X-API-Key": otherKey}

	e2bError(t, "create without a key", call(t, "POST", url+"/v2/sandboxes", nil, `{"templateID":"base"}`), 401)
	e2bError(t, "create with a key roched does not know", call(t, "POST", url+"/v2/sandboxes",
		map[string]string{"X-API-Key": "e2b_0123456789abcdef0123456789abcdef01234567"}, `{"templateID":"base"}`), 401)
	e2bError(t, "an unknown template", call(t, "POST", url+"/v2/sandboxes", acme, `{"templateID":"nope"}`), 404)

	r := call(t, "POST", url+"/v2/sandboxes", acme, `{"templateID":"base","timeout":120}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sb struct {
		SandboxID, EnvdAccessToken, Domain string
	}
	if err := json.Unmarshal([]byte(r.body), &sb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { call(t, "DELETE", url+"/sandboxes/"+sb.SandboxID, acme, "") })
	if want := strings.TrimPrefix(url, "http://"); sb.Domain != want {
		t.Errorf("create named domain %q, not roched's own %q", sb.Domain, want)
	}

	// The other tenant neither sees nor touches it.
	e2bError(t, "another tenant's get info", call(t, "GET", url+"/sandboxes/"+sb.SandboxID, other, ""), 404)
	e2bError(t, "another tenant's kill", call(t, "DELETE", url+"/sandboxes/"+sb.SandboxID, other, ""), 404)
	e2bError(t, "another tenant's connect", call(t, "POST", url+"/v2/sandboxes/"+sb.SandboxID+"/connect", other, `{}`), 404)
	if r := call(t, "GET", url+"/v2/sandboxes", other, ""); r.body != "[]\n" {
		t.Errorf("another tenant's list shows %s", r.body)
	}
	// A forged id: the Roche id with the other tenant's name (the MAC no longer fits).
	rid, _, _ := strings.Cut(sb.SandboxID, ".")
	forged := rid + ".other." + strings.Repeat("0", 32)
	e2bError(t, "a forged id", call(t, "GET", url+"/sandboxes/"+forged, other, ""), 404)

	stat := func(id, token string) reply {
		h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json"}
		if token != "" {
			h["X-Access-Token"] = token
		}
		return call(t, "POST", url+"/filesystem.Filesystem/Stat", h, `{"path":"/etc/hostname"}`)
	}
	if r := stat(sb.SandboxID, sb.EnvdAccessToken); r.status != 200 || !strings.Contains(r.body, "hostname") {
		t.Fatalf("envd Stat with the access token: %d %s", r.status, r.body)
	}
	e2bError(t, "envd without an access token", stat(sb.SandboxID, ""), 401)
	e2bError(t, "envd with another sandbox's token", stat(sb.SandboxID, strings.Repeat("ab", 32)), 401)
	e2bError(t, "envd with a forged id", stat(forged, sb.EnvdAccessToken), 404)
	run := func(id string) reply {
		h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49999"}
		return call(t, "POST", url+"/execute", h, `{"code":"open('/tmp/pwned','w').write('x')"}`)
	}
	e2bError(t, "code with a forged id", run(forged), 404)
	// The Roche id (docker ps shows it) with the owner's own tenant name, but no MAC: the
	// code interpreter's calls carry no token, so the id's MAC is all that stops this.
	e2bError(t, "code with the owner's name and no MAC", run(rid+".acme."+strings.Repeat("0", 32)), 404)
	e2bError(t, "code with the bare Roche id", run(rid), 404)
	e2bError(t, "an unserved port", call(t, "GET", url+"/", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8080"}, ""), 502)

	// None of it reached the sandbox: it is there, and the file the forged call would
	// have written is not.
	if r := call(t, "GET", url+"/sandboxes/"+sb.SandboxID, acme, ""); r.status != 200 {
		t.Fatalf("the sandbox is gone after the attempts: %d %s", r.status, r.body)
	}
	if r := stat(sb.SandboxID, sb.EnvdAccessToken); r.status != 200 {
		t.Fatal(r.body)
	}
	h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": sb.EnvdAccessToken}
	if r := call(t, "POST", url+"/filesystem.Filesystem/Stat", h, `{"path":"/tmp/pwned"}`); r.status == 200 {
		t.Errorf("the forged code ran: /tmp/pwned exists")
	}
	if r := call(t, "DELETE", url+"/sandboxes/"+sb.SandboxID, acme, ""); r.status != 204 {
		t.Errorf("kill: %d %s", r.status, r.body)
	}
	e2bError(t, "kill of a killed sandbox", call(t, "DELETE", url+"/sandboxes/"+sb.SandboxID, acme, ""), 404)
}
