// Package e2b is roched's E2B listener (--e2b-listen): E2B's REST control plane, its
// in-sandbox API (envd: process.Process and filesystem.Filesystem over Connect, /files,
// /health) and its code interpreter's /execute and /contexts, on one host:port, so that
// E2B's own SDKs run unmodified against roched with E2B_API_URL and E2B_SANDBOX_URL
// pointing at it (docs/e2b.md).
//
// It is a client of roched like any other: every call becomes a call of roched's own
// service (roche.v1.SandboxService) on an in-process connection, made as the tenant the
// caller's API key names (internal/daemon DialAs), through the Go client's provider
// interfaces (durable commands, the files API, code contexts). It depends on the daemon,
// never the other way round.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
)

// EnvdVersion is the envd version roched reports: the SDKs enable features by it, so it
// names the newest version whose features are all served (stdin, CloseStdin, the default
// user, octet-stream and gzip uploads), and not 0.6.2, which adds file metadata (extended
// attributes), which roched does not keep.
const EnvdVersion = "0.5.7"

// JupyterPort is the port the code interpreter SDKs address (E2b-Sandbox-Port).
const JupyterPort = "49999"

// EnvdPort is envd's port.
const EnvdPort = "49983"

// LocalTenant is the tenant of the key roched makes itself (Server.Env's E2B_API_KEY).
const LocalTenant = "e2b"

// Server is the E2B listener of one roched.
type Server struct {
	d        *daemon.Daemon
	log      *slog.Logger
	settings Settings
	// url is the listener's base URL, both E2B_API_URL and E2B_SANDBOX_URL; domain the
	// host:port create responses name.
	url, domain string
	// localKey is the key roched made (or found in its state directory), of LocalTenant;
	// "" when settings turned it off.
	localKey string
	// secret signs envd access tokens (accessToken).
	secret []byte

	mu      sync.Mutex
	clients map[string]*client.Client

	handler http.Handler
}

// New makes the E2B listener of a started daemon (daemon.NewFrontend).
func New(d *daemon.Daemon, s daemon.FrontendSettings) (daemon.Frontend, error) {
	settings, err := parseSettings(s.Raw)
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(s.Addr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	if lh, _, err := net.SplitHostPort(strings.TrimPrefix(s.Listen, "tcp://")); err == nil && lh != "" && net.ParseIP(lh) == nil {
		host = lh // a name, as the certificate names it
	}
	scheme := "http"
	if s.TLS {
		scheme = "https"
	}
	srv := &Server{
		d: d, log: s.Log, settings: settings,
		domain:  net.JoinHostPort(host, port),
		clients: map[string]*client.Client{},
	}
	srv.url = scheme + "://" + srv.domain
	if srv.secret, err = loadSecret(filepath.Join(s.StateDir, "e2b.secret"), 32); err != nil {
		return nil, err
	}
	if !settings.NoLocalKey {
		raw, err := loadSecret(filepath.Join(s.StateDir, "e2b.key"), 20)
		if err != nil {
			return nil, err
		}
		srv.localKey = "e2b_" + hex.EncodeToString(raw)
	}
	srv.handler = srv.routes()
	return srv, nil
}

// Handler implements daemon.Frontend.
func (s *Server) Handler() http.Handler { return s.handler }

// Env implements daemon.Frontend: the lines E2B's SDKs need.
func (s *Server) Env() []string {
	lines := []string{"export E2B_API_URL=" + s.url, "export E2B_SANDBOX_URL=" + s.url}
	if s.localKey != "" {
		lines = append(lines, "export E2B_API_KEY="+s.localKey)
	}
	return lines
}

// loadSecret reads n random bytes kept hex in path (mode 0600), making them first.
func loadSecret(path string, n int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("%s is open to others (mode %04o): chmod 600 %s", path, fi.Mode().Perm(), path)
		}
		raw, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(raw) != n {
			return nil, fmt.Errorf("%s does not hold %d hex bytes: remove it and roched makes a new one", path, n)
		}
		return raw, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	raw := make([]byte, n)
	_, _ = rand.Read(raw)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(hex.EncodeToString(raw) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return raw, err
}

// tenantOfKey names the tenant an E2B API key belongs to: the key roched made, or a
// token of roched's own tenants of E2B's form (e2b_ and hex).
func (s *Server) tenantOfKey(key string) (string, bool) {
	if !validKey(key) {
		return "", false
	}
	if s.localKey != "" && subtle.ConstantTimeCompare([]byte(key), []byte(s.localKey)) == 1 {
		return LocalTenant, true
	}
	return s.d.TenantOfToken(key)
}

// validKey reports whether key has E2B's form: e2b_ and hex digits.
func validKey(key string) bool {
	h, ok := strings.CutPrefix(key, "e2b_")
	if !ok || len(h) < 32 || len(h) > 128 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// Sandbox ids. The id E2B's clients see is Roche's id, the tenant's name and a MAC of
// both: "ROCHEID.TENANT.MAC". Requests that name a sandbox (E2b-Sandbox-Id) carry no API
// key, and the code interpreter SDK's /contexts calls not even the access token, so the
// id itself is what lets a request reach a sandbox, as a sandbox's id and port are on
// E2B's public traffic: a guessed or altered id reaches nothing. envd's calls need the
// access token besides, as E2B's secure sandboxes do.

func (s *Server) mac(parts ...string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(m.Sum(nil))
}

// e2bID is the E2B id of tenant's sandbox rid.
func (s *Server) e2bID(tenant, rid string) string {
	return rid + "." + tenant + "." + s.mac("id", tenant, rid)[:32]
}

// parseID checks an E2B id and returns its tenant and Roche id.
func (s *Server) parseID(id string) (tenant, rid string, ok bool) {
	parts := strings.Split(id, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return "", "", false
	}
	want := s.e2bID(parts[1], parts[0])
	if subtle.ConstantTimeCompare([]byte(id), []byte(want)) != 1 {
		return "", "", false
	}
	return parts[1], parts[0], true
}

// accessToken is the envd access token of the sandbox of E2B id id.
func (s *Server) accessToken(id string) string { return s.mac("envd", id) }

// client is the Roche client that calls roched as tenant.
func (s *Server) client(tenant string) (*client.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[tenant]; ok {
		return c, nil
	}
	c, err := client.New(client.WithDialer(func(ctx context.Context) (net.Conn, error) {
		return s.d.DialAs(ctx, tenant)
	}))
	if err != nil {
		return nil, err
	}
	s.clients[tenant] = c
	return c, nil
}

// provider is tenant's provider interface for calls that name a sandbox (the daemon
// finds its provider by its id).
func (s *Server) provider(tenant string) (*client.Provider, error) {
	c, err := s.client(tenant)
	if err != nil {
		return nil, err
	}
	return c.Provider(""), nil
}

// routes sends a request with E2b-Sandbox-Id to the sandbox's envd or code
// interpreter, and anything else to the control plane.
func (s *Server) routes() http.Handler {
	control := s.controlPlane()
	envd := s.envd()
	interp := s.interpreter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("E2b-Sandbox-Id")
		if id == "" {
			control.ServeHTTP(w, r)
			return
		}
		switch port := r.Header.Get("E2b-Sandbox-Port"); port {
		case EnvdPort, "":
			envd.ServeHTTP(w, r)
		case JupyterPort:
			interp.ServeHTTP(w, r)
		default:
			writeError(w, http.StatusBadGateway, fmt.Sprintf("port %s of sandbox %s: roched serves only envd (%s) and the code interpreter (%s) of a sandbox; other ports are not forwarded (docs/e2b.md)", port, id, EnvdPort, JupyterPort))
		}
	})
}

// sandboxCall is an envd or interpreter request's sandbox (its Roche id) and the
// provider interface of its tenant.
type sandboxCall struct {
	id     string
	tenant string
	p      *client.Provider
}

// authSandbox checks the sandbox id a request names (E2b-Sandbox-Id) and, when token,
// its access token (X-Access-Token); it answers a refusal itself.
func (s *Server) authSandbox(w http.ResponseWriter, r *http.Request, token bool) (sandboxCall, bool) {
	id := r.Header.Get("E2b-Sandbox-Id")
	tenant, rid, ok := s.parseID(id)
	if !ok {
		writeError(w, http.StatusNotFound, "sandbox "+id+" not found")
		return sandboxCall{}, false
	}
	if token && subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(s.accessToken(id))) != 1 {
		writeError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token for sandbox "+id+": send the envdAccessToken of its create or connect response")
		return sandboxCall{}, false
	}
	p, err := s.provider(tenant)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return sandboxCall{}, false
	}
	return sandboxCall{id: rid, tenant: tenant, p: p}, true
}
