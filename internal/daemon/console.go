package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/internal/console"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/provider/kit"
)

// The console (roched --ui): the pages at /ui/ (internal/console) and the few reads the
// API lacks at /ui/api/, on the TCP listener only, behind the same tokens and tenants as
// the API. The page is signed in either with a one-time login code that roche ui prints
// (console_login.go: a session cookie, HttpOnly and SameSite=Strict, honoured only with
// the console's own header) or with a token the user pastes, which it keeps in the tab's
// sessionStorage and sends as a bearer header. A request a browser marks as coming from
// another origin is refused (sameOrigin) either way.

// Roles: what a token may do as its tenant.
const (
	// RoleAdmin, a tenant's own token, may call everything the API has.
	RoleAdmin = "admin"
	// RoleReadOnly, one of a tenant's read_only_token_sha256, may look (list, inspect,
	// pools, commands' output, egress and audit logs) and change nothing: no create,
	// exec, terminal, copy or destroy.
	RoleReadOnly = "read-only"
)

// readOnlyMethods are the API methods a read-only tenant may call: those that change
// nothing in a sandbox, the pools or the daemon. Anything not listed is refused, so a
// method added later is closed to the role until it is added here.
var readOnlyMethods = map[string]bool{
	"List": true, "Inspect": true, "PoolStatus": true, "ListProviders": true,
	"ListCommands": true, "ConnectCommand": true, "EgressLog": true, "EgressEvents": true, "ListSecrets": true,
	"ListWorkspaces": true, "ListSnapshots": true, "ListContexts": true,
}

// readOnlyAllows reports whether a read-only tenant may make request r.
func readOnlyAllows(r *http.Request) bool {
	p := r.URL.Path
	if m, ok := strings.CutPrefix(p, "/"+rochev1connect.SandboxServiceName+"/"); ok {
		return readOnlyMethods[m]
	}
	if strings.HasPrefix(p, "/grpc.reflection.") {
		return true
	}
	switch p {
	case "/healthz", "/metrics":
		return true
	case "/ui/api/login-code":
		// It mints a session of the caller's own role: read-only here.
		return r.Method == http.MethodPost
	}
	return strings.HasPrefix(p, "/ui/") && (r.Method == http.MethodGet || r.Method == http.MethodHead)
}

// permissionDenied answers a call a tenant's role does not allow, in the protocol the
// call speaks.
func permissionDenied(w http.ResponseWriter, r *http.Request, why error) {
	err := connect.NewError(connect.CodePermissionDenied, why)
	if ew := connect.NewErrorWriter(); ew.IsSupported(r) {
		_ = ew.Write(w, r, err)
		return
	}
	http.Error(w, err.Message(), http.StatusForbidden)
}

// sameOrigin refuses a request a browser sent from a page of another origin: its Origin
// header (or, without one, Sec-Fetch-Site) names a site other than the one the request
// is addressed to. Clients that are not browsers send neither and pass.
func sameOrigin(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Errorf("a request from a page of %s to %s is refused: roched's console and API answer their own origin only", o, r.Host)
		}
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		if u.Scheme != scheme {
			return fmt.Errorf("a request from a page of %s to %s://%s is refused: roched's console and API answer their own origin only", o, scheme, r.Host)
		}
		return nil
	}
	if s := r.Header.Get("Sec-Fetch-Site"); s == "cross-site" || s == "same-site" {
		return fmt.Errorf("a request from a page of another site (Sec-Fetch-Site: %s) is refused: roched's console and API answer their own origin only", s)
	}
	return nil
}

// auditRing keeps the last audit lines for the console, each tenant seeing its own.
type auditRing struct {
	mu      sync.Mutex
	entries []ledger.AuditEntry
	next    int
	full    bool
}

// auditKept is how many audit lines the console can show, across tenants.
const auditKept = 2000

func (a *auditRing) add(e ledger.AuditEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.entries == nil {
		a.entries = make([]ledger.AuditEntry, auditKept)
	}
	a.entries[a.next] = e
	a.next = (a.next + 1) % auditKept
	a.full = a.full || a.next == 0
}

// of returns tenant's lines, newest first, at most limit.
func (a *auditRing) of(tenant string, limit int) []ledger.AuditEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []ledger.AuditEntry{}
	n := a.next
	if a.full {
		n = auditKept
	}
	for i := 1; i <= n && len(out) < limit; i++ {
		e := a.entries[(a.next-i+auditKept)%auditKept]
		if e.Tenant == tenant {
			out = append(out, e)
		}
	}
	return out
}

// consoleMux adds the console's routes to the TCP listener's mux.
func (d *Daemon) consoleMux(mux *http.ServeMux) {
	mux.Handle("/ui", console.Handler("/ui/"))
	mux.Handle("/ui/", console.Handler("/ui/"))
	mux.HandleFunc("GET /ui/api/whoami", d.consoleWhoami)
	mux.HandleFunc("GET /ui/api/usage", d.consoleUsage)
	mux.HandleFunc("GET /ui/api/ended", d.consoleEnded)
	mux.HandleFunc("GET /ui/api/audit", d.consoleAudit)
	mux.HandleFunc("POST /ui/api/login-code", d.consoleLoginCode)
	mux.HandleFunc("POST /ui/session", d.consoleSignIn)
	mux.HandleFunc("DELETE /ui/session", d.consoleSignOut)
}

// consolePage reports whether the request is for one of the console's pages, which carry
// no data and are served without a token (a browser cannot send one when it loads them),
// or its sign-in and sign-out (/ui/session), whose credential is the code or cookie.
func consolePage(r *http.Request) bool {
	return (r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, "/ui/")) && !strings.HasPrefix(r.URL.Path, "/ui/api/")
}

func (d *Daemon) consoleTenant(w http.ResponseWriter, r *http.Request) (*tenant, bool) {
	console.SetHeaders(w.Header())
	t, ok := r.Context().Value(tenantKey{}).(*tenant)
	if !ok || t == nil {
		http.Error(w, "the call has no tenant", http.StatusForbidden)
		return nil, false
	}
	return t, true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// consoleWhoami is who the token is: its tenant and role, which the page uses to show
// only what the role may do (roched refuses the rest either way).
func (d *Daemon) consoleWhoami(w http.ResponseWriter, r *http.Request) {
	t, ok := d.consoleTenant(w, r)
	if !ok {
		return
	}
	writeJSON(w, map[string]any{"tenant": t.Name, "role": roleOf(t), "providers": d.ledger.Providers()})
}

// usageTimeout bounds the reading of one sandbox's usage.
const usageTimeout = 3 * time.Second

// consoleUsage is the live CPU time, memory and processes of each of the tenant's
// running sandboxes whose provider can read them without running a command inside
// (kit.UsageReader: the engine, the cgroup's files, or the sandbox's agent).
func (d *Daemon) consoleUsage(w http.ResponseWriter, r *http.Request) {
	t, ok := d.consoleTenant(w, r)
	if !ok {
		return
	}
	list, err := d.ledger.List(r.Context(), &t.Tenant, "")
	if err != nil && len(list) == 0 {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	out := map[string]any{}
	for _, sb := range list {
		if sb.State != roche.StateRunning {
			continue
		}
		u, err := d.usageOf(r.Context(), &t.Tenant, sb.ID)
		switch {
		case errors.Is(err, roche.ErrUnsupported):
		case err != nil:
			out[sb.ID] = map[string]string{"error": err.Error()}
		default:
			out[sb.ID] = u
		}
	}
	writeJSON(w, out)
}

func (d *Daemon) usageOf(ctx context.Context, t *ledger.Tenant, id string) (kit.Usage, error) {
	tg, err := d.ledger.Resolve(t, id)
	if err != nil {
		return kit.Usage{}, err
	}
	ur, ok := tg.Provider.(kit.UsageReader)
	if !ok {
		return kit.Usage{}, fmt.Errorf("%w: provider %s cannot read a sandbox's usage", roche.ErrUnsupported, tg.Provider.Name())
	}
	ctx, cancel := context.WithTimeout(ctx, usageTimeout)
	defer cancel()
	return ur.Usage(ctx, tg.ID)
}

// consoleEnded is the tenant's sandboxes that ended within --ended-retention, with why.
func (d *Daemon) consoleEnded(w http.ResponseWriter, r *http.Request) {
	t, ok := d.consoleTenant(w, r)
	if !ok {
		return
	}
	list := d.ledger.Ended(&t.Tenant)
	if list == nil {
		list = []roche.SandboxInfo{}
	}
	writeJSON(w, list)
}

// consoleAudit is the tenant's last audit lines, newest first.
func (d *Daemon) consoleAudit(w http.ResponseWriter, r *http.Request) {
	t, ok := d.consoleTenant(w, r)
	if !ok {
		return
	}
	writeJSON(w, d.auditLog.of(t.Name, 200))
}
