package daemon

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
)

// Frontends. roched can serve another API on a listener of its own, on top of its own
// service: the E2B API (internal/e2b, --e2b-listen). A frontend is a client of the
// daemon like any other: it calls roche.v1.SandboxService over an in-process connection
// (DialAs) as the tenant its caller authenticated as, so every call goes through the same
// handlers, tenant checks, limits and audit log as a call on the socket. The frontend's
// package depends on this one, not the other way round: cmd/roched hands Main its
// constructor.

// Frontend is an API served on its own listener.
type Frontend interface {
	// Handler serves the frontend's requests on its listener.
	Handler() http.Handler
	// Env is the shell lines a client of the frontend needs (export NAME=VALUE), printed
	// at start and served to the socket's owner (roche e2b env).
	Env() []string
}

// FrontendSettings are what a frontend's constructor gets.
type FrontendSettings struct {
	// Listen is the frontend's address, tcp://HOST:PORT, as the operator gave it; Addr is
	// the one listened on (the port a ":0" got) and TLS whether it is served over TLS.
	Listen string
	Addr   net.Addr
	TLS    bool
	// Raw is the frontend's section of the config file ("e2b"), undecoded; nil without.
	Raw json.RawMessage
	// StateDir is the directory of roched's state file, where a frontend may keep what
	// must outlive a restart (files mode 0600).
	StateDir string
	Log      *slog.Logger
}

// NewFrontend makes the frontend of a started daemon.
type NewFrontend func(d *Daemon, s FrontendSettings) (Frontend, error)

// TenantOfToken names the tenant whose bearer token (--token-file, ROCHE_TOKEN or
// --tokens-file) token is, comparing hashes in constant time; false when none, and for
// a read-only token, since a frontend acts as its tenant with every right (DialAs).
func (d *Daemon) TenantOfToken(token string) (string, bool) {
	if t := match(d.tenants, token); t != nil && !t.readOnly {
		return t.Name, true
	}
	return "", false
}

// DialAs opens an in-process connection to the daemon's API on which every call is made
// as the named tenant: one of the configured tenants (with its limits and mount roots),
// or else a tenant of that name with the daemon's --allow-mount-root directories, as a
// tenant known by its client certificate alone. The caller must have authenticated whoever
// it dials for. Nothing outside the process can reach these connections.
func (d *Daemon) DialAs(ctx context.Context, tenant string) (net.Conn, error) {
	t, err := d.certTenant(tenant)
	if err != nil {
		return nil, err
	}
	if d.pipes == nil {
		return nil, errors.New("roched is not serving: in-process connections start with it")
	}
	return d.pipes.dial(ctx, t)
}

// pipeListener is the in-process listener DialAs connects to: each connection is one end
// of a net.Pipe that carries its tenant.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// pipeConn is the daemon's end of an in-process connection.
type pipeConn struct {
	net.Conn
	tenant *tenant
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) dial(ctx context.Context, t *tenant) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- pipeConn{Conn: server, tenant: t}:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, net.ErrClosed
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "in-process" }

// pipeTenantKey holds, in an in-process connection's context, its tenant.
type pipeTenantKey struct{}

// servePipes serves the API to in-process connections, each as its own tenant.
func (d *Daemon) servePipes() {
	d.pipes = newPipeListener()
	api := d.apiMux()
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t, _ := r.Context().Value(pipeTenantKey{}).(*tenant)
			if t == nil {
				http.Error(w, "no tenant", http.StatusForbidden)
				return
			}
			api.ServeHTTP(w, r.WithContext(withTenant(r.Context(), t)))
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if pc, ok := c.(pipeConn); ok {
				return context.WithValue(ctx, pipeTenantKey{}, pc.tenant)
			}
			return ctx
		},
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	d.servers = append(d.servers, srv)
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		_ = srv.Serve(d.pipes)
	}()
}

// startFrontend opens the frontend's listener (TLS as the TCP listener's) and serves it.
func (d *Daemon) startFrontend(stdout io.Writer) error {
	addr, err := parseListen(d.cfg.E2BListen)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%w: listening on %s: %v", roche.ErrUnavailable, d.cfg.E2BListen, err)
	}
	tlsOn := d.cfg.TLSCert != ""
	if tlsOn {
		// The same certificate as the TCP listener's, reloaded the same way, but no
		// client certificates: E2B's SDKs authenticate with their API key.
		t, err := newTLSFiles(d.cfg.TLSCert, d.cfg.TLSKey, "", d.log)
		if err != nil {
			l.Close()
			return err
		}
		l = tls.NewListener(l, t.serverConfig())
		d.bg.Add(1)
		go func() {
			defer d.bg.Done()
			t.watch(d.draining, tlsReloadInterval)
		}()
	}
	f, err := d.newFrontend(d, FrontendSettings{
		Listen: d.cfg.E2BListen, Addr: l.Addr(), TLS: tlsOn, Raw: d.cfg.E2B,
		StateDir: filepath.Dir(d.cfg.StateFile), Log: d.log,
	})
	if err != nil {
		l.Close()
		return err
	}
	d.frontend = f
	srv := &http.Server{
		Handler:           f.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	srv.Protocols.SetHTTP2(true)
	d.servers = append(d.servers, srv)
	d.frontendAddr = l.Addr()
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("serving stopped", "addr", l.Addr().String(), "err", err)
		}
	}()
	for _, line := range f.Env() {
		fmt.Fprintln(stdout, line)
	}
	d.log.Info("e2b listening", "addr", l.Addr().String(), "tls", tlsOn)
	return nil
}

// FrontendAddr is the address the frontend listens on, or nil.
func (d *Daemon) FrontendAddr() net.Addr { return d.frontendAddr }

// frontendEnv serves the frontend's Env lines to the socket's owner (roche e2b env).
func (d *Daemon) frontendEnv(w http.ResponseWriter, r *http.Request) {
	if d.frontend == nil {
		http.Error(w, "roched serves no E2B listener: start it with --e2b-listen tcp://127.0.0.1:3000", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	for _, line := range d.frontend.Env() {
		fmt.Fprintln(w, line)
	}
}
