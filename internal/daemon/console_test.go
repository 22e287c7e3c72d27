package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/internal/ledger"
)

// consoleDaemon is a daemon on TCP with the console on, over the in-memory provider
// (these tests are of the edge's rules: who may call what, from which origin), with two
// tenants, acme and other, and a read-only token of acme's.
type consoleDaemon struct {
	d                     *Daemon
	mp                    *memProvider
	addr                  string
	acme, viewer, otherTk string
}

func startConsoleDaemon(t *testing.T, ui bool) *consoleDaemon {
	t.Helper()
	cd := &consoleDaemon{mp: &memProvider{live: map[string]roche.SandboxInfo{}},
		acme: randomToken(), viewer: randomToken(), otherTk: randomToken()}
	cfg := Config{
		Socket: filepath.Join(shortDir(t), "roched.sock"), Listen: "tcp://127.0.0.1:0", UI: ui,
		Tenants: []Tenant{
			{Name: "acme", TokenSHA256: HashToken(cd.acme), ReadOnlyTokenSHA256: []string{HashToken(cd.viewer)}},
			{Name: "other", TokenSHA256: HashToken(cd.otherTk)},
		},
	}
	d, err := New(cfg, map[string]roche.Provider{"mem": cd.mp})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctxFor(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	cd.d = d
	cd.addr = "http://" + d.TCPAddr().String()
	return cd
}

// headerTransport sets headers on every request: a bearer token, an Origin.
type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (cd *consoleDaemon) rpc(headers map[string]string) rochev1connect.SandboxServiceClient {
	return rochev1connect.NewSandboxServiceClient(&http.Client{Transport: headerTransport(headers)}, cd.addr)
}

func bearer(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

// get makes a plain GET with the headers given and returns the status, headers and body.
func (cd *consoleDaemon) get(t *testing.T, path string, headers map[string]string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, cd.addr+path, nil)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func (cd *consoleDaemon) create(t *testing.T, tok string) string {
	t.Helper()
	resp, err := cd.rpc(bearer(tok)).Create(ctxFor(t, 30*time.Second), connect.NewRequest(&rochev1.CreateRequest{
		Provider: "mem", Config: memConfig()}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Sandbox.Id
}

// TestConsoleOffUnlessAsked: without --ui there is nothing at /ui/, even with a token.
func TestConsoleOffUnlessAsked(t *testing.T) {
	cd := startConsoleDaemon(t, false)
	if code, _, _ := cd.get(t, "/ui/", nil); code != http.StatusUnauthorized {
		t.Errorf("GET /ui/ without --ui or a token: %d, want 401", code)
	}
	if code, _, _ := cd.get(t, "/ui/", bearer(cd.acme)); code != http.StatusNotFound {
		t.Errorf("GET /ui/ without --ui: %d, want 404", code)
	}
	if code, _, _ := cd.get(t, "/ui/api/whoami", bearer(cd.acme)); code != http.StatusNotFound {
		t.Errorf("GET /ui/api/whoami without --ui: %d, want 404", code)
	}
	cfg := Config{Socket: filepath.Join(shortDir(t), "roched.sock"), UI: true}
	if _, err := New(cfg, map[string]roche.Provider{"mem": &memProvider{live: map[string]roche.SandboxInfo{}}}); err == nil ||
		!strings.Contains(err.Error(), "--ui serves the console on the TCP address of --listen") {
		t.Errorf("--ui without --listen: %v", err)
	}
}

// TestConsolePages: the pages are served without a token (they hold no data), with the
// security headers and never a cookie; the data behind them needs a token, in the
// Authorization header only.
func TestConsolePages(t *testing.T) {
	cd := startConsoleDaemon(t, true)
	if code, h, _ := cd.get(t, "/ui", nil); code != http.StatusFound || h.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want a redirect to /ui/", code, h.Get("Location"))
	}
	for path, want := range map[string]string{
		"/ui/": "text/html", "/ui/app.js": "text/javascript", "/ui/app.css": "text/css",
		"/ui/vendor/xterm.js": "text/javascript", "/ui/vendor/xterm.css": "text/css",
	} {
		code, h, body := cd.get(t, path, nil)
		if code != http.StatusOK || !strings.HasPrefix(h.Get("Content-Type"), want) || body == "" {
			t.Errorf("GET %s: %d %q (%d bytes), want 200 %s", path, code, h.Get("Content-Type"), len(body), want)
		}
		csp := h.Get("Content-Security-Policy")
		for _, d := range []string{"default-src 'none'", "script-src 'self';", "frame-ancestors 'none'", "connect-src 'self'"} {
			if !strings.Contains(csp, d) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %q", path, csp, d)
			}
		}
		if strings.Contains(csp, "unsafe-eval") || strings.Contains(strings.Split(csp, "script-src")[1], "unsafe-inline;") {
			t.Errorf("GET %s: Content-Security-Policy %q lets scripts run inline or eval", path, csp)
		}
		if h.Get("X-Frame-Options") != "DENY" || h.Get("X-Content-Type-Options") != "nosniff" || len(h.Values("Set-Cookie")) > 0 {
			t.Errorf("GET %s: headers %v", path, h)
		}
	}
	if code, _, _ := cd.get(t, "/ui/nope.js", nil); code != http.StatusNotFound {
		t.Errorf("GET /ui/nope.js: %d, want 404", code)
	}
	req, _ := http.NewRequest(http.MethodPost, cd.addr+"/ui/", strings.NewReader("x"))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui/: %v %v, want 405", resp, err)
	} else {
		resp.Body.Close()
	}

	// The data: a token in the header, never one in the URL.
	for _, path := range []string{"/ui/api/whoami", "/ui/api/usage", "/ui/api/ended", "/ui/api/audit"} {
		if code, _, _ := cd.get(t, path, nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, code)
		}
		if code, _, _ := cd.get(t, path+"?token="+cd.acme+"&access_token="+cd.acme, nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s with the token in the URL: %d, want 401", path, code)
		}
	}
	code, _, body := cd.get(t, "/ui/api/whoami", bearer(cd.acme))
	var me struct{ Tenant, Role string }
	if err := json.Unmarshal([]byte(body), &me); code != http.StatusOK || err != nil || me.Tenant != "acme" || me.Role != RoleAdmin {
		t.Errorf("whoami as acme: %d %s", code, body)
	}
}

// TestReadOnlyToken: a tenant's read-only token sees its sandboxes and cannot run,
// open a terminal in, copy into or destroy one, nor reach the E2B frontend as its
// tenant; every refusal is PERMISSION_DENIED and the sandbox is untouched.
func TestReadOnlyToken(t *testing.T) {
	cd := startConsoleDaemon(t, true)
	ctx := ctxFor(t, time.Minute)
	id := cd.create(t, cd.acme)
	ro := cd.rpc(bearer(cd.viewer))

	list, err := ro.List(ctx, connect.NewRequest(&rochev1.ListRequest{}))
	if err != nil || len(list.Msg.Sandboxes) != 1 || list.Msg.Sandboxes[0].Id != id {
		t.Fatalf("read-only List: %v %v", list, err)
	}
	if _, err := ro.Inspect(ctx, connect.NewRequest(&rochev1.InspectRequest{SandboxId: id})); err != nil {
		t.Errorf("read-only Inspect: %v", err)
	}
	if _, err := ro.PoolStatus(ctx, connect.NewRequest(&rochev1.PoolStatusRequest{})); err != nil {
		t.Errorf("read-only PoolStatus: %v", err)
	}
	denied := func(what string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("read-only %s: %v, want PERMISSION_DENIED saying it is read-only", what, err)
		}
	}
	_, err = ro.Create(ctx, connect.NewRequest(&rochev1.CreateRequest{Provider: "mem", Config: memConfig()}))
	denied("Create", err)
	_, err = ro.Exec(ctx, connect.NewRequest(&rochev1.ExecRequest{SandboxId: id, Cmd: []string{"true"}}))
	denied("Exec", err)
	es, err := ro.ExecStream(ctx, connect.NewRequest(&rochev1.ExecStreamRequest{SandboxId: id, Cmd: []string{"true"}}))
	if err == nil {
		for es.Receive() {
		}
		err = es.Err()
	}
	denied("ExecStream", err)
	_, err = ro.CreatePty(ctx, connect.NewRequest(&rochev1.CreatePtyRequest{SandboxId: id}))
	denied("CreatePty", err)
	_, err = ro.SendPtyInput(ctx, connect.NewRequest(&rochev1.SendPtyInputRequest{SandboxId: id, Pid: 1, Data: []byte("id\n")}))
	denied("SendPtyInput", err)
	_, err = ro.StartCommand(ctx, connect.NewRequest(&rochev1.StartCommandRequest{SandboxId: id, Cmd: []string{"true"}}))
	denied("StartCommand", err)
	_, err = ro.EgressPolicy(ctx, connect.NewRequest(&rochev1.EgressPolicyRequest{SandboxId: id, Allow: []string{"example.org"}}))
	denied("EgressPolicy", err)
	_, err = ro.SetTimeout(ctx, connect.NewRequest(&rochev1.SetTimeoutRequest{SandboxId: id, TimeoutSecs: 5}))
	denied("SetTimeout", err)
	_, err = ro.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{id}}))
	denied("Destroy", err)
	_, err = ro.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{All: true}))
	denied("Destroy all", err)
	_, err = ro.PoolDrain(ctx, connect.NewRequest(&rochev1.PoolDrainRequest{}))
	denied("PoolDrain", err)
	if !slices.Contains(cd.mp.ids(), id) {
		t.Fatalf("sandbox %s is gone after the read-only token's calls", id)
	}
	if _, err := ro.Inspect(ctx, connect.NewRequest(&rochev1.InspectRequest{SandboxId: id})); err != nil {
		t.Errorf("after the refusals: %v", err)
	}
	code, _, body := cd.get(t, "/ui/api/whoami", bearer(cd.viewer))
	if code != http.StatusOK || !strings.Contains(body, `"role":"read-only"`) || !strings.Contains(body, `"tenant":"acme"`) {
		t.Errorf("whoami as the read-only token: %d %s", code, body)
	}
	// A frontend (E2B) acts with every right of the tenant it finds: a read-only token
	// finds none.
	if name, ok := cd.d.TenantOfToken(cd.viewer); ok {
		t.Errorf("TenantOfToken(read-only token) = %q: the E2B frontend would serve it as its tenant with every right", name)
	}
	if name, ok := cd.d.TenantOfToken(cd.acme); !ok || name != "acme" {
		t.Errorf("TenantOfToken(acme's token) = %q %v", name, ok)
	}
	// The admin token does what the read-only one could not.
	if _, err := cd.rpc(bearer(cd.acme)).Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{id}})); err != nil {
		t.Fatal(err)
	}
}

// TestCrossOriginRefused: a request a browser sends from another origin's page is refused
// even with a good token (were a token ever to reach such a page), and one from the
// console's own origin passes.
func TestCrossOriginRefused(t *testing.T) {
	cd := startConsoleDaemon(t, true)
	ctx := ctxFor(t, time.Minute)
	host := strings.TrimPrefix(cd.addr, "http://")
	for _, h := range []map[string]string{
		{"Origin": "http://attacker.test"},
		{"Origin": "http://" + host + ".attacker.test"},
		{"Origin": "https://" + host},
		{"Origin": "null"},
		{"Sec-Fetch-Site": "cross-site"},
	} {
		h["Authorization"] = "Bearer " + cd.acme
		_, err := cd.rpc(h).Create(ctx, connect.NewRequest(&rochev1.CreateRequest{Provider: "mem", Config: memConfig()}))
		if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "own origin only") {
			t.Errorf("Create with %v: %v, want PERMISSION_DENIED", h, err)
		}
		if code, _, _ := cd.get(t, "/ui/api/whoami", h); code != http.StatusForbidden {
			t.Errorf("whoami with %v: %d, want 403", h, code)
		}
	}
	if n := len(cd.mp.ids()); n != 0 {
		t.Fatalf("%d sandboxes made by cross-origin requests", n)
	}
	same := map[string]string{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin", "Authorization": "Bearer " + cd.acme}
	resp, err := cd.rpc(same).Create(ctx, connect.NewRequest(&rochev1.CreateRequest{Provider: "mem", Config: memConfig()}))
	if err != nil {
		t.Fatalf("Create from the console's own origin: %v", err)
	}
	if _, err := cd.rpc(same).Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{resp.Msg.Sandbox.Id}})); err != nil {
		t.Fatal(err)
	}
}

// TestConsoleTenantScope: the console's own reads (ended sandboxes, the audit log) show
// a tenant its own alone, as the API does.
func TestConsoleTenantScope(t *testing.T) {
	cd := startConsoleDaemon(t, true)
	ctx := ctxFor(t, time.Minute)
	mine := cd.create(t, cd.acme)
	theirs := cd.create(t, cd.otherTk)
	for tok, id := range map[string]string{cd.acme: mine, cd.otherTk: theirs} {
		if _, err := cd.rpc(bearer(tok)).Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{id}})); err != nil {
			t.Fatal(err)
		}
	}
	var ended []roche.SandboxInfo
	eventually(t, 10*time.Second, "acme's ended sandbox", func() bool {
		_, _, body := cd.get(t, "/ui/api/ended", bearer(cd.viewer))
		ended = nil
		_ = json.Unmarshal([]byte(body), &ended)
		return len(ended) > 0
	})
	if len(ended) != 1 || ended[0].ID != mine || ended[0].End == nil || ended[0].End.Kind != roche.EndDestroyed {
		t.Errorf("acme's ended sandboxes: %+v, want %s alone, destroyed", ended, mine)
	}
	_, _, body := cd.get(t, "/ui/api/audit", bearer(cd.viewer))
	var audit []ledger.AuditEntry
	if err := json.Unmarshal([]byte(body), &audit); err != nil {
		t.Fatal(err)
	}
	ops := map[string]bool{}
	for _, e := range audit {
		if e.Tenant != "acme" || e.Attrs["id"] == theirs {
			t.Errorf("acme's audit log shows %+v", e)
		}
		if e.Attrs["id"] == mine {
			ops[e.Op] = true
		}
	}
	if !ops["create"] || !ops["destroy"] {
		t.Errorf("acme's audit log lacks its create and destroy of %s: %+v", mine, audit)
	}
}

func TestReadOnlyTokensValidated(t *testing.T) {
	good := HashToken(randomToken())
	for _, tc := range []struct {
		tenants []Tenant
		want    string
	}{
		{[]Tenant{{Name: "a", TokenSHA256: good, ReadOnlyTokenSHA256: []string{"zz"}}}, "read_only_token_sha256 must be 64 hex digits"},
		{[]Tenant{{Name: "a", TokenSHA256: good, ReadOnlyTokenSHA256: []string{good}}}, "same token"},
		{[]Tenant{{Name: "a", TokenSHA256: HashToken(randomToken()), ReadOnlyTokenSHA256: []string{good}}, {Name: "b", TokenSHA256: good}}, "same token"},
	} {
		err := Config{Listen: "tcp://127.0.0.1:0", Tenants: tc.tenants}.Validate([]string{"docker"})
		if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.tenants, err, tc.want)
		}
	}
}

func memConfig() *rochev1.SandboxConfig {
	img := "img"
	return &rochev1.SandboxConfig{Image: &img}
}

// TestAuditRing: the console's audit lines are the newest, each tenant's own, after
// the ring has wrapped.
func TestAuditRing(t *testing.T) {
	var a auditRing
	for i := range auditKept + 10 {
		tn := "a"
		if i%2 == 1 {
			tn = "b"
		}
		a.add(ledger.AuditEntry{Tenant: tn, Op: "exec", Attrs: map[string]any{"n": i}})
	}
	got := a.of("b", 3)
	if len(got) != 3 || got[0].Attrs["n"] != auditKept+9 || got[2].Attrs["n"] != auditKept+5 {
		t.Fatalf("b's newest three: %+v", got)
	}
	all := a.of("a", auditKept)
	if len(all) != auditKept/2 || all[len(all)-1].Attrs["n"] != 10 {
		t.Fatalf("a's lines after the wrap: %d, oldest %v", len(all), all[len(all)-1].Attrs["n"])
	}
	if n := len(a.of("c", 10)); n != 0 {
		t.Fatalf("a tenant with no lines sees %d", n)
	}
}
