package daemon

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/console"
)

// Signing in to the console with a one-time login code (roche ui), as Jupyter does: a
// client holding a tenant's token asks roched for a code (POST /ui/api/login-code), and
// the browser the user opens the printed URL in exchanges it for a session cookie
// (POST /ui/session). The token itself never goes into a URL, a page or a cookie.
//
//   - A code is 256 random bits, kept only as its hash, good for loginCodeTTL and for
//     one exchange: the first exchange removes it, used or not in time.
//   - The session acts as the tenant, with the role, of the token that asked for the
//     code: a read-only token mints read-only sessions. A session cannot mint codes.
//   - The cookie is HttpOnly, SameSite=Strict, Secure when roched serves TLS, and only
//     its hash is kept. A request it authenticates must also carry the console's header
//     (consoleHeader), which a page of another origin cannot send without a CORS
//     preflight roched never answers; sameOrigin refuses such pages besides.

const (
	// loginCodeTTL is how long a login code may wait for its exchange.
	loginCodeTTL = 2 * time.Minute
	// sessionTTL is how long a console session lasts, from its sign-in.
	sessionTTL = 12 * time.Hour
	// maxLoginCodes and maxSessions bound what roched holds for them at once.
	maxLoginCodes = 256
	maxSessions   = 1024
	// sessionCookie names the console's cookie.
	sessionCookie = "roche_console"
	// consoleHeader must come with every request a session cookie authenticates.
	consoleHeader = "X-Roche-Console"
)

// consoleAuth keeps the pending login codes and the open sessions, by their hashes.
type consoleAuth struct {
	mu       sync.Mutex
	codes    map[[sha256.Size]byte]consoleGrant
	sessions map[[sha256.Size]byte]consoleGrant
	// now is the clock (tests move it).
	now func() time.Time
}

// consoleGrant is who a code or session acts as, until when.
type consoleGrant struct {
	t       *tenant
	expires time.Time
}

func (a *consoleAuth) clock() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}

// sweep drops what has expired; a.mu is held.
func (a *consoleAuth) sweep(now time.Time) {
	for h, g := range a.codes {
		if !now.Before(g.expires) {
			delete(a.codes, h)
		}
	}
	for h, g := range a.sessions {
		if !now.Before(g.expires) {
			delete(a.sessions, h)
		}
	}
}

func randomSecret() (string, [sha256.Size]byte) {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	s := base64.RawURLEncoding.EncodeToString(b)
	return s, sha256.Sum256([]byte(s))
}

// issue makes a login code for t.
func (a *consoleAuth) issue(t *tenant) (string, time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.clock()
	a.sweep(now)
	if a.codes == nil {
		a.codes = map[[sha256.Size]byte]consoleGrant{}
	}
	if len(a.codes) >= maxLoginCodes {
		return "", time.Time{}, fmt.Errorf("%w: %d console login codes are waiting to be used: use one, or wait %s for them to expire",
			roche.ErrExhausted, len(a.codes), loginCodeTTL)
	}
	code, h := randomSecret()
	g := consoleGrant{t: t, expires: now.Add(loginCodeTTL)}
	a.codes[h] = g
	return code, g.expires, nil
}

// errLoginCode is the one answer to a code that is unknown, used or expired.
var errLoginCode = errors.New("this console login code is not valid: it was used already, has expired or was never issued; run roche ui for a new login URL")

// exchange spends code (whatever the outcome) and opens a session for its tenant.
func (a *consoleAuth) exchange(code string) (string, consoleGrant, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.clock()
	h := sha256.Sum256([]byte(code))
	g, ok := a.codes[h]
	delete(a.codes, h)
	a.sweep(now)
	if !ok || !now.Before(g.expires) {
		return "", consoleGrant{}, errLoginCode
	}
	if a.sessions == nil {
		a.sessions = map[[sha256.Size]byte]consoleGrant{}
	}
	if len(a.sessions) >= maxSessions {
		return "", consoleGrant{}, fmt.Errorf("%w: roched holds %d console sessions: sign out of some, or wait for them to expire", roche.ErrExhausted, maxSessions)
	}
	sid, sh := randomSecret()
	s := consoleGrant{t: g.t, expires: now.Add(sessionTTL)}
	a.sessions[sh] = s
	return sid, s, nil
}

// session returns the tenant of session id, or nil.
func (a *consoleAuth) session(id string) *tenant {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := sha256.Sum256([]byte(id))
	g, ok := a.sessions[h]
	if !ok {
		return nil
	}
	if !a.clock().Before(g.expires) {
		delete(a.sessions, h)
		return nil
	}
	return g.t
}

func (a *consoleAuth) end(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.sessions, sha256.Sum256([]byte(id)))
}

// sessionKey marks a request a console session authenticated.
type sessionKey struct{}

// sessionCaller is the tenant of the request's console session cookie; found is false
// when it carries none (the bearer token or certificate rules then apply).
func (d *Daemon) sessionCaller(r *http.Request) (t *tenant, found bool, why error) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil, false, nil
	}
	if r.Header.Get(consoleHeader) == "" {
		return nil, true, fmt.Errorf("a request with the console's session cookie must carry the %s header (the console's pages send it)", consoleHeader)
	}
	if t = d.consoleAuth.session(c.Value); t == nil {
		return nil, true, errors.New("the console session has expired or was signed out: run roche ui for a new login URL")
	}
	return t, true, nil
}

// LoginCode is what POST /ui/api/login-code answers: the URL to open, and until when
// its code may be exchanged.
type LoginCode struct {
	URL     string    `json:"url"`
	Expires time.Time `json:"expires_at"`
}

// consoleLoginCode issues a one-time login code for the caller's tenant and role. It
// needs the token (or certificate) itself: a console session cannot mint codes.
func (d *Daemon) consoleLoginCode(w http.ResponseWriter, r *http.Request) {
	t, ok := d.consoleTenant(w, r)
	if !ok {
		return
	}
	if bySession, _ := r.Context().Value(sessionKey{}).(bool); bySession {
		permissionDenied(w, r, fmt.Errorf("%w: a console session cannot issue login codes: use the tenant's token (roche ui)", roche.ErrPermission))
		return
	}
	code, exp, err := d.consoleAuth.issue(t)
	if err != nil {
		http.Error(w, err.Error(), http.StatusTooManyRequests)
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	d.audit(r.Context(), "console-login-code", nil, "role", roleOf(t))
	// The code goes in the fragment, which browsers do not send: it reaches roched only
	// in the page's POST, never in a request line, a log or a Referer.
	writeJSON(w, LoginCode{URL: scheme + "://" + r.Host + "/ui/#code=" + code, Expires: exp})
}

func roleOf(t *tenant) string {
	if t.readOnly {
		return RoleReadOnly
	}
	return RoleAdmin
}

// consoleSignIn exchanges a login code (a JSON body {"code": ...}) for a session cookie.
// It needs no token: the code is the credential, and it is spent by this call.
func (d *Daemon) consoleSignIn(w http.ResponseWriter, r *http.Request) {
	console.SetHeaders(w.Header())
	var body struct {
		Code string `json:"code"`
	}
	if r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "send the login code as JSON: {\"code\": \"...\"}", http.StatusUnsupportedMediaType)
		return
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&body); err != nil || body.Code == "" {
		http.Error(w, "send the login code as JSON: {\"code\": \"...\"}", http.StatusBadRequest)
		return
	}
	sid, s, err := d.consoleAuth.exchange(body.Code)
	if err != nil {
		d.log.Warn("console login code refused", "remote", r.RemoteAddr, "why", err)
		status := http.StatusUnauthorized
		if errors.Is(err, roche.ErrExhausted) {
			status = http.StatusTooManyRequests
		}
		http.Error(w, err.Error(), status)
		return
	}
	http.SetCookie(w, newSessionCookie(r, sid, int(sessionTTL/time.Second)))
	d.audit(withTenant(r.Context(), s.t), "console-sign-in", nil, "role", roleOf(s.t))
	writeJSON(w, map[string]any{"tenant": s.t.Name, "role": roleOf(s.t), "expires_at": s.expires})
}

// consoleSignOut ends the request's session and clears its cookie.
func (d *Daemon) consoleSignOut(w http.ResponseWriter, r *http.Request) {
	console.SetHeaders(w.Header())
	if c, err := r.Cookie(sessionCookie); err == nil {
		d.consoleAuth.end(c.Value)
	}
	http.SetCookie(w, newSessionCookie(r, "", -1))
	w.WriteHeader(http.StatusNoContent)
}

// newSessionCookie is the session cookie for request r: HttpOnly, SameSite=Strict, and
// Secure when r came over TLS.
func newSessionCookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: sessionCookie, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode}
}
