package daemon

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/cli"
)

// loginCode asks for a login code with the headers given; it returns the status and, on
// success, the code and the URL.
func (cd *consoleDaemon) loginCode(t *testing.T, headers map[string]string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, cd.addr+"/ui/api/login-code", nil)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, "", ""
	}
	var lc LoginCode
	if err := json.NewDecoder(resp.Body).Decode(&lc); err != nil {
		t.Fatal(err)
	}
	_, code, ok := strings.Cut(lc.URL, "/ui/#code=")
	if !ok || code == "" || !strings.HasPrefix(lc.URL, cd.addr+"/ui/#code=") {
		t.Fatalf("login URL %q: want %s/ui/#code=CODE", lc.URL, cd.addr)
	}
	if time.Until(lc.Expires) > loginCodeTTL || time.Until(lc.Expires) <= 0 {
		t.Errorf("login code expires at %s: want within %s", lc.Expires, loginCodeTTL)
	}
	return resp.StatusCode, code, lc.URL
}

// signIn exchanges code the way the page does; it returns the status and the cookie set.
func (cd *consoleDaemon) signIn(t *testing.T, code string, headers map[string]string) (int, *http.Cookie, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"code": code})
	req, _ := http.NewRequest(http.MethodPost, cd.addr+"/ui/session", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie {
			return resp.StatusCode, c, string(b)
		}
	}
	return resp.StatusCode, nil, string(b)
}

// session is the headers the console's page sends with its session cookie.
func session(c *http.Cookie) map[string]string {
	return map[string]string{"Cookie": sessionCookie + "=" + c.Value, consoleHeader: "1"}
}

func (cd *consoleDaemon) setClock(now func() time.Time) {
	cd.d.consoleAuth.mu.Lock()
	defer cd.d.consoleAuth.mu.Unlock()
	cd.d.consoleAuth.now = now
}

// TestConsoleLoginCode: roche ui's one-time login code. A tenant's token gets a code (in
// the URL's fragment, the token nowhere in it); the code buys one session cookie
// (HttpOnly, SameSite=Strict) that acts as that tenant with that token's role; the
// attacks: the same code again, an expired code, a cookie without the console's header,
// a session minting codes, a cross-origin exchange, a signed-out cookie, all refused.
func TestConsoleLoginCode(t *testing.T) {
	cd := startConsoleDaemon(t, true)
	mine := cd.create(t, cd.acme)
	theirs := cd.create(t, cd.otherTk)

	if code, _, _ := cd.loginCode(t, nil); code != http.StatusUnauthorized {
		t.Errorf("a login code without a token: %d, want 401", code)
	}
	_, code, u := cd.loginCode(t, bearer(cd.acme))
	if strings.Contains(u, cd.acme) {
		t.Fatalf("the token is in the login URL %s", u)
	}
	pu, _ := url.Parse(u)
	if pu.RawQuery != "" || pu.Path != "/ui/" {
		t.Errorf("login URL %s: the code belongs in the fragment, which browsers do not send", u)
	}

	// A cross-origin page cannot spend it (and it stays good for the real page).
	if st, c, _ := cd.signIn(t, code, map[string]string{"Origin": "http://evil.example"}); st != http.StatusForbidden || c != nil {
		t.Errorf("a cross-origin exchange: %d with cookie %v, want 403 and none", st, c)
	}
	st, cookie, body := cd.signIn(t, code, nil)
	if st != http.StatusOK || cookie == nil {
		t.Fatalf("exchanging the code: %d %s, cookie %v", st, body, cookie)
	}
	if !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" || cookie.Secure {
		t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/, not Secure on plain HTTP", cookie)
	}
	if cookie.Value == code || strings.Contains(cookie.Value, cd.acme) {
		t.Errorf("the session cookie is the code or the token")
	}

	// The attack: the same code a second time.
	if st, c, body := cd.signIn(t, code, nil); st != http.StatusUnauthorized || c != nil || !strings.Contains(body, "roche ui") {
		t.Errorf("the code used twice: %d %q, cookie %v; want 401 and no cookie", st, body, c)
	}

	// The session acts as acme's admin: it sees acme's sandbox, not other's.
	if st, _, body := cd.get(t, "/ui/api/whoami", session(cookie)); st != http.StatusOK || !strings.Contains(body, `"tenant":"acme"`) || !strings.Contains(body, `"role":"admin"`) {
		t.Errorf("whoami by the session: %d %s", st, body)
	}
	list, err := cd.rpc(session(cookie)).List(ctxFor(t, 10*time.Second), connect.NewRequest(&rochev1.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range list.Msg.Sandboxes {
		ids = append(ids, sb.Id)
	}
	if len(ids) != 1 || ids[0] != mine {
		t.Errorf("the session lists %v, want only acme's %s (not other's %s)", ids, mine, theirs)
	}
	// Without the console's header, the cookie is no credential (a cross-site form post
	// could send the cookie, never the header).
	if st, _, _ := cd.get(t, "/ui/api/whoami", map[string]string{"Cookie": sessionCookie + "=" + cookie.Value}); st != http.StatusUnauthorized {
		t.Errorf("the cookie without %s: %d, want 401", consoleHeader, st)
	}
	// A session cannot mint codes: the chain starts at the token.
	if st, _, _ := cd.loginCode(t, session(cookie)); st != http.StatusForbidden {
		t.Errorf("a login code asked for by a session: %d, want 403", st)
	}

	// A read-only token's code makes a read-only session, which cannot destroy.
	_, roCode, _ := cd.loginCode(t, bearer(cd.viewer))
	_, roCookie, _ := cd.signIn(t, roCode, nil)
	if roCookie == nil {
		t.Fatal("no session for the read-only token's code")
	}
	if _, _, body := cd.get(t, "/ui/api/whoami", session(roCookie)); !strings.Contains(body, `"role":"read-only"`) {
		t.Errorf("whoami of the read-only token's session: %s", body)
	}
	_, err = cd.rpc(session(roCookie)).Destroy(ctxFor(t, 10*time.Second), connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{mine}}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("Destroy by a read-only session: %v, want permission_denied", err)
	}
	if !slices.Contains(cd.mp.ids(), mine) {
		t.Fatalf("sandbox %s destroyed by a read-only session", mine)
	}

	// Signed out: the cookie is refused from then on.
	req, _ := http.NewRequest(http.MethodDelete, cd.addr+"/ui/session", nil)
	req.AddCookie(&http.Cookie{Name: sessionCookie, Value: roCookie.Value})
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	if st, _, _ := cd.get(t, "/ui/api/whoami", session(roCookie)); st != http.StatusUnauthorized {
		t.Errorf("a signed-out session: %d, want 401", st)
	}

	// The attack: a code used after it expired; then a session after it expired.
	_, late, _ := cd.loginCode(t, bearer(cd.acme))
	start := time.Now()
	cd.setClock(func() time.Time { return start.Add(loginCodeTTL + time.Second) })
	if st, c, _ := cd.signIn(t, late, nil); st != http.StatusUnauthorized || c != nil {
		t.Errorf("an expired code: %d, cookie %v; want 401 and none", st, c)
	}
	cd.setClock(func() time.Time { return start.Add(sessionTTL + time.Second) })
	if st, _, _ := cd.get(t, "/ui/api/whoami", session(cookie)); st != http.StatusUnauthorized {
		t.Errorf("an expired session: %d, want 401", st)
	}
	cd.setClock(nil)
	if st, _, _ := cd.get(t, "/ui/api/whoami", session(cookie)); st != http.StatusUnauthorized {
		t.Errorf("a session swept when it expired answers again: %d", st)
	}
}

// TestConsoleSessionCookieSecureOnTLS: over TLS the session cookie is Secure as well.
func TestConsoleSessionCookieSecureOnTLS(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "https://127.0.0.1/ui/session", nil)
	r.TLS = &tls.ConnectionState{}
	c := newSessionCookie(r, "x", 60)
	if !c.Secure || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
		t.Errorf("the session cookie over TLS: %+v, want Secure, HttpOnly, SameSite=Strict", c)
	}
}

// TestRocheUI: roche ui prints a login URL for the token's tenant that signs a browser
// in once, and says in one line what to do without --address, or against a roched
// without --ui.
func TestRocheUI(t *testing.T) {
	cd := startConsoleDaemon(t, true)
	t.Setenv("ROCHE_TOKEN_FILE", "")
	t.Setenv("ROCHE_ADDRESS", "")
	t.Setenv("TRACEPARENT", "")
	roche := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		args = append([]string{"--socket", filepath.Join(shortDir(t), "none.sock")}, args...)
		code := cli.Main(args, strings.NewReader(""), &out, &errb, nil)
		return code, out.String(), errb.String()
	}
	t.Setenv("ROCHE_TOKEN", cd.acme)
	code, out, errs := roche("--address", cd.addr, "ui")
	u := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(u, cd.addr+"/ui/#code=") || strings.Contains(out, cd.acme) || !strings.Contains(errs, "open it before") {
		t.Fatalf("roche ui: %d %q %q", code, out, errs)
	}
	st, cookie, body := cd.signIn(t, strings.TrimPrefix(u, cd.addr+"/ui/#code="), nil)
	if st != http.StatusOK || cookie == nil || !strings.Contains(body, `"tenant":"acme"`) {
		t.Fatalf("the URL of roche ui: %d %s", st, body)
	}

	oneLine := func(what string, code int, errs, want string) {
		t.Helper()
		if code == 0 || strings.Count(strings.TrimSpace(errs), "\n") > 0 || !strings.Contains(errs, want) {
			t.Errorf("%s: %d %q, want one line saying %q", what, code, errs, want)
		}
	}
	code, _, errs = roche("ui")
	oneLine("roche ui on the socket", code, errs, "set ROCHE_ADDRESS")
	t.Setenv("ROCHE_TOKEN", randomToken())
	code, _, errs = roche("--address", cd.addr, "ui")
	oneLine("roche ui with a wrong token", code, errs, "refused the token")
	off := startConsoleDaemon(t, false)
	t.Setenv("ROCHE_TOKEN", off.acme)
	code, _, errs = roche("--address", off.addr, "ui")
	oneLine("roche ui against a roched without --ui", code, errs, "start it with --ui")
}
