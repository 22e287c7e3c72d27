// Package daemon is roched's API edge: the Roche API (roche.v1.SandboxService over gRPC,
// gRPC-Web and Connect's HTTP/JSON) on a unix socket and, with a token, on TCP; who a
// call is from (tenants.go), /healthz and /metrics, the strict codecs, and the command
// line (main.go). What the calls act on, the ledger of sandboxes with its warm pools,
// reaper, admission and the state a restarted daemon finds (internal/ledger), is behind
// it: each handler authenticates, calls the ledger, and converts through internal/wire.
package daemon

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/defaults"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/pool"
)

// Config is what the daemon serves and how.
type Config struct {
	// Socket is the unix socket to listen on (mode 0600); empty means defaults.Socket().
	Socket string
	// Listen, when set ("tcp://127.0.0.1:7878"), also serves on TCP. It needs Token or
	// Tenants.
	Listen string
	// Token is the bearer token of the one TCP tenant, DefaultTenant, sent as
	// "Authorization: Bearer TOKEN" on every request but /healthz. The unix socket is
	// guarded by its mode and serves LocalTenant.
	Token string
	// Tenants are TCP tenants known by their tokens' hashes (the tokens file).
	Tenants []Tenant
	// TLSCert and TLSKey are PEM files of the certificate and key TCP is served with
	// (tls.go); both or neither. They are read again when they change.
	TLSCert, TLSKey string
	// ClientCA, with TLS, is a PEM file of the CAs whose client certificates TCP
	// requires; a certificate's Common Name names its tenant.
	ClientCA string
	// Insecure lets TCP be plaintext on a host that is not a loopback address.
	Insecure bool
	// AllowMountRoots are host directories below which every TCP tenant may mount; with
	// none (and no tenant's own mount_roots), TCP tenants cannot mount host paths. The
	// local tenant may mount anywhere: the socket's owner can run the provider itself.
	AllowMountRoots []string
	// AllowRootSandboxes lets creates run commands as root (uid or gid 0, or a user
	// name, which the image may map to 0). Off, such creates are refused.
	AllowRootSandboxes bool
	// StateFile keeps the daemon's sandboxes across restarts; empty means beside the socket.
	StateFile string
	// MaxSandboxes bounds the sandboxes handed to clients at once (0: no bound). Idle
	// pooled sandboxes are bounded by their pools instead.
	MaxSandboxes int
	// MaxCommands bounds the background commands running at once in one sandbox (0:
	// roche.MaxRunningCommands).
	MaxCommands int
	// EndedRetention is how long Inspect answers for a sandbox that ended (0:
	// roche.DefaultEndedRetention).
	EndedRetention time.Duration
	// Pools are the warm pools.
	Pools []pool.Spec
	// PoolConcurrency fixes how many sandboxes all pools together create at once; 0
	// lets it adapt, from the machine's cores up (pool.WithConcurrency).
	PoolConcurrency int
	// ReapInterval is how often expired sandboxes are looked for (default 1 s).
	ReapInterval time.Duration
	// ReconcileInterval is how often the daemon compares its state with the providers'
	// (default 30 s), forgetting sandboxes removed behind its back.
	ReconcileInterval time.Duration
	// HeartbeatInterval is how long ExecStream stays quiet before a heartbeat (default 5 s).
	HeartbeatInterval time.Duration
	// CopyMaxBytes caps the file content one CopyTo or CopyFrom moves (default
	// roche.DefaultCopyMaxBytes); a request may ask for less, not more.
	CopyMaxBytes int64
	// Asked are the providers the operator named (roched --providers): with the pools'
	// providers, those whose being unavailable makes /healthz "degraded".
	Asked []string
	// LeftOut are the providers that could not be opened at start, and why (/healthz).
	LeftOut map[string]error
	// EngineCheckInterval is how often each provider's engine is asked whether it answers
	// (default 2 s; internal/ledger health.go).
	EngineCheckInterval time.Duration
	// MaxUploadBytes bounds one CopyTo upload (default wire.MaxUploadBytes; tests lower it).
	MaxUploadBytes int64
	// DirectOwner is the owner roched's own user's direct-mode CLI gives its sandboxes
	// (cli:USER@HOST, or ROCHE_OWNER; roched's --direct-owner): those are served, as its
	// own, to a caller on the unix socket that runs as roched's user (internal/ledger
	// direct.go). Empty serves none.
	DirectOwner string
	// E2BListen, when set ("tcp://127.0.0.1:3000"), serves the E2B API there (a
	// Frontend, internal/e2b), over TLS with TLSCert and TLSKey, plaintext only on a
	// loopback address unless Insecure. E2B is the config file's "e2b" section for it.
	E2BListen string
	E2B       json.RawMessage
	// UI serves the web console at /ui/ on the TCP listener (Listen), behind its tokens
	// (console.go).
	UI bool
	// ReplicaGroup makes this roched one of the replicas of that name, which all serve
	// the same sandboxes (internal/ledger group.go; roched --replica-group); ReplicaID
	// names it in the group's leader election (default: host name and instance), and
	// LeaderLease is how long a dead leader keeps the lead (0: the provider's default).
	ReplicaGroup, ReplicaID string
	LeaderLease             time.Duration
	// OTLPEndpoint, when set (an http:// or https:// URL of an OTLP/HTTP traces
	// receiver, e.g. http://127.0.0.1:4318/v1/traces), turns tracing on (tracing.go);
	// main.go resolves it from --otlp-endpoint and the OTEL_EXPORTER_OTLP_* variables.
	OTLPEndpoint string
}

// ReplicaLeaseGrace is how long a leased sandbox outlives its last holder when roched
// runs as a replica: time for a client whose replica died to hold it through another.
const ReplicaLeaseGrace = 15 * time.Second

// Option configures a Daemon.
type Option func(*Daemon)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(d *Daemon) { d.log = l } }

// WithFrontend makes the frontend Config.E2BListen serves, and where it prints the lines
// its clients need (Frontend.Env).
func WithFrontend(f NewFrontend, stdout io.Writer) Option {
	return func(d *Daemon) { d.newFrontend, d.stdout = f, stdout }
}

// WithPoolOptions passes options to the pool manager (tests shorten its janitor).
func WithPoolOptions(opts ...pool.Option) Option {
	return func(d *Daemon) { d.poolOpts = append(d.poolOpts, opts...) }
}

// Daemon is a running roched: its listeners and handlers in front of its ledger.
type Daemon struct {
	cfg Config
	log *slog.Logger
	// traces exports spans; nil when tracing is off (tracing.go).
	traces   *sdktrace.TracerProvider
	poolOpts []pool.Option
	ledger   *ledger.Ledger
	metrics  *metrics
	// providers are those served, for /healthz's availability checks.
	providers map[string]roche.Provider
	started   time.Time

	// output bounds the unary Exec output held at once (output.go).
	output outputBudget
	// watches counts each tenant's open watches; watchers are those roched holds for
	// clients that poll (watchers.go).
	watches  watchCounter
	watchers watcherSet

	// tenants are the TCP tenants; local is the unix socket's, and ownUser the same
	// tenant when the caller runs as roched's own user (SO_PEERCRED), who is served its
	// direct-mode sandboxes too.
	tenants []*tenant
	local   *tenant
	ownUser *tenant
	// tls serves TCP's certificates (nil: plaintext); certTenants are the tenants known
	// by a client certificate alone (tls.go).
	tls         *tlsFiles
	certMu      sync.Mutex
	certTenants map[string]*tenant

	// draining is closed when Shutdown begins: long calls that would hold it up (Hold)
	// end then.
	draining chan struct{}
	bg       sync.WaitGroup
	servers  []*http.Server
	tcpAddr  net.Addr
	shutdown sync.Once
	// stopEgress ends the observing of egress decisions (egress.go).
	stopEgress func()
	// secrets is the secret store (secrets.go); learning, the learn-mode sandboxes'
	// needed entries (egress.go).
	secrets  secretStore
	learning learnSet
	// auditLog keeps the last audit lines for the console (console.go).
	auditLog auditRing
	// consoleAuth keeps the console's login codes and sessions (console_login.go).
	consoleAuth consoleAuth

	// pipes are the in-process connections frontends call the API on (frontend.go);
	// newFrontend makes the frontend of E2BListen, frontend is it once started.
	pipes        *pipeListener
	newFrontend  NewFrontend
	frontend     Frontend
	frontendAddr net.Addr
	stdout       io.Writer
}

// ledgerConfig is the part of cfg the ledger keeps.
func (c Config) ledgerConfig() ledger.Config {
	return ledger.Config{
		DefaultProvider: catalog.Default, StateFile: c.StateFile, MaxSandboxes: c.MaxSandboxes, AllowRootSandboxes: c.AllowRootSandboxes,
		Pools: c.Pools, PoolConcurrency: c.PoolConcurrency, ReapInterval: c.ReapInterval,
		ReconcileInterval: c.ReconcileInterval, EngineCheckInterval: c.EngineCheckInterval,
		DirectOwner: c.DirectOwner, ProviderOf: catalog.OfID,
		MaxCommands: c.MaxCommands, EndedRetention: c.EndedRetention,
		Group: c.ReplicaGroup, Identity: c.ReplicaID, LeaderLease: c.LeaderLease,
	}
}

// New validates cfg and prepares a daemon; Start makes it serve.
func New(cfg Config, providers map[string]roche.Provider, opts ...Option) (*Daemon, error) {
	if len(providers) == 0 {
		return nil, fmt.Errorf("%w: no providers to serve", roche.ErrInvalidConfig)
	}
	if cfg.Socket == "" {
		cfg.Socket = defaults.Socket()
	}
	if cfg.StateFile == "" {
		cfg.StateFile = defaults.StateFile(cfg.Socket)
	}
	if cfg.CopyMaxBytes <= 0 {
		cfg.CopyMaxBytes = roche.DefaultCopyMaxBytes
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 5 * time.Second
	}
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	if err := cfg.Validate(names); err != nil {
		return nil, err
	}
	d := &Daemon{
		cfg:       cfg,
		providers: providers,
		log:       slog.New(slog.DiscardHandler),
		tenants:   buildTenants(cfg),
		local:     &tenant{Tenant: ledger.Tenant{Name: LocalTenant, Local: true}},
		ownUser:   &tenant{Tenant: ledger.Tenant{Name: LocalTenant, Local: true, Direct: true}},
		draining:  make(chan struct{}),
		output:    outputBudget{left: maxHeldOutput},
	}
	for _, o := range opts {
		o(d)
	}
	if cfg.Listen != "" && cfg.TLSCert != "" {
		t, err := newTLSFiles(cfg.TLSCert, cfg.TLSKey, cfg.ClientCA, d.log)
		if err != nil {
			return nil, err
		}
		d.tls = t
	}
	d.metrics = newMetrics(d)
	lopts := []ledger.Option{ledger.WithLogger(d.log), ledger.WithObserver(d.metrics),
		ledger.WithPoolOptions(d.poolOpts...), ledger.WithAuditSink(d.auditLog.add)}
	if cfg.OTLPEndpoint != "" {
		tp, err := newTracerProvider(context.Background(), cfg.OTLPEndpoint)
		if err != nil {
			return nil, err
		}
		d.traces = tp
		lopts = append(lopts, ledger.WithTracer(tp.Tracer(tracerName)))
	}
	l, err := ledger.New(cfg.ledgerConfig(), providers, lopts...)
	if err != nil {
		if d.traces != nil {
			_ = d.traces.Shutdown(context.Background())
		}
		return nil, err
	}
	d.ledger = l
	d.secrets.owners = d.clientOwners
	stopObserving := d.observeEgress()
	// A proxy started again (after a restart) gets its stored secrets' values.
	stopHook := egress.OnRegister(d.secrets.registered)
	d.stopEgress = func() { stopObserving(); stopHook() }
	return d, nil
}

// Validate reports every problem with the settings at once, for a daemon serving the
// named providers.
func (c Config) Validate(providers []string) error {
	limits, pools := c.ledgerConfig().Problems(providers)
	errs := limits
	if c.Listen != "" {
		if addr, err := parseListen(c.Listen); err != nil {
			errs = append(errs, err)
		} else {
			if c.Token == "" && len(c.Tenants) == 0 && c.ClientCA == "" {
				errs = append(errs, fmt.Errorf("%w: refusing to listen on %s without a token: anyone who can reach it could run code; pass --token-file FILE (mode 0600), set ROCHE_TOKEN, give tenants with --tokens-file, or require client certificates with --client-ca",
					roche.ErrInvalidConfig, c.Listen))
			}
			host, _, _ := net.SplitHostPort(addr)
			errs = append(errs, c.validateTLS(host)...)
		}
	}
	if c.UI && c.Listen == "" {
		errs = append(errs, fmt.Errorf("%w: --ui serves the console on the TCP address of --listen, behind its tokens: give --listen tcp://HOST:PORT too", roche.ErrInvalidConfig))
	}
	if c.E2BListen != "" {
		if addr, err := parseListen(c.E2BListen); err != nil {
			errs = append(errs, fmt.Errorf("--e2b-listen: %w", err))
		} else {
			host, _, _ := net.SplitHostPort(addr)
			errs = append(errs, c.validateTLSOf("--e2b-listen "+c.E2BListen, host, c.Listen == "")...)
		}
	}
	errs = append(errs, c.validateTenants()...)
	return errors.Join(append(errs, pools...)...)
}

// parseListen parses "tcp://HOST:PORT".
func parseListen(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "tcp" || u.Host == "" || u.Path != "" {
		return "", fmt.Errorf("%w: listen address %q: use tcp://HOST:PORT, e.g. tcp://127.0.0.1:7878", roche.ErrInvalidConfig, s)
	}
	return u.Host, nil
}

// ServeUntilSignal is roched's main loop: it starts d (within two minutes), serves until
// SIGINT or SIGTERM, and then drains it within shutdown. A second signal while it drains
// kills the process outright.
func (d *Daemon) ServeUntilSignal(shutdown time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err := d.Start(sctx)
	cancel()
	if err != nil {
		return err
	}
	<-ctx.Done()
	stop()
	d.log.Info("signal received: draining", "timeout", shutdown)
	shctx, cancel := context.WithTimeout(context.Background(), shutdown)
	defer cancel()
	return d.Shutdown(shctx)
}

// Start claims the socket, reconciles with the providers, starts the pools and the
// reaper, and serves. It returns once the listeners are open.
func (d *Daemon) Start(ctx context.Context) error {
	d.started = time.Now()
	// The socket is claimed first: a second daemon on it must fail before it reads the
	// state file, or it would destroy the running daemon's idle pool as leftovers.
	unixL, err := listenUnix(d.cfg.Socket)
	if err != nil {
		return err
	}
	listeners := []net.Listener{unixL}
	closeAll := func() {
		for _, l := range listeners {
			l.Close()
		}
	}
	if d.cfg.Listen != "" {
		addr, _ := parseListen(d.cfg.Listen)
		tcpL, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("%w: listening on %s: %v", roche.ErrUnavailable, d.cfg.Listen, err)
		}
		d.tcpAddr = tcpL.Addr()
		if d.tls != nil {
			// /healthz and /metrics are on this listener too, behind the same TLS.
			tcpL = tls.NewListener(tcpL, d.tls.serverConfig())
			d.bg.Add(1)
			go func() {
				defer d.bg.Done()
				d.tls.watch(d.draining, tlsReloadInterval)
			}()
		}
		listeners = append(listeners, tcpL)
	}
	// Connections wait in the listeners' backlog until the ledger has recovered.
	if err := d.ledger.Start(ctx); err != nil {
		closeAll()
		return err
	}
	d.servePipes()

	for i, l := range listeners {
		srv := &http.Server{
			// The unix socket is guarded by its mode (0600, owner only) and serves the
			// local tenant; TCP serves whichever tenant the token names.
			Handler:           d.handler(i > 0),
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
		}
		// HTTP/1.1 for Connect and curl, HTTP/2 (cleartext, or over TLS) for gRPC clients.
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
		srv.Protocols.SetHTTP2(true)
		if i == 0 {
			srv.ConnContext = ownUserConn
		}
		d.servers = append(d.servers, srv)
		d.bg.Add(1)
		go func(l net.Listener) {
			defer d.bg.Done()
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.Error("serving stopped", "addr", l.Addr().String(), "err", err)
			}
		}(l)
	}
	attrs := []any{"socket", d.cfg.Socket, "state", d.cfg.StateFile, "owner", d.ledger.Owner(), "providers", d.ledger.Providers(),
		"max_sandboxes", d.cfg.MaxSandboxes, "tenants", len(d.tenants)}
	if d.tcpAddr != nil {
		attrs = append(attrs, "tcp", d.tcpAddr.String(), "tls", d.tls != nil)
		if d.tls != nil {
			attrs = append(attrs, "tls_serial", d.tls.serial, "client_ca", d.cfg.ClientCA != "")
		}
	}
	for _, p := range d.ledger.Pools() {
		attrs = append(attrs, "pool", p.Spec().String())
	}
	d.log.Info("roched listening", attrs...)
	if d.cfg.E2BListen != "" {
		if d.newFrontend == nil {
			return fmt.Errorf("%w: --e2b-listen: this roched has no E2B frontend built in", roche.ErrInvalidConfig)
		}
		if err := d.startFrontend(cmp.Or[io.Writer](d.stdout, io.Discard)); err != nil {
			return err
		}
	}
	return nil
}

// Socket is the unix socket the daemon listens on.
func (d *Daemon) Socket() string { return d.cfg.Socket }

// TCPAddr is the TCP address served, or nil.
func (d *Daemon) TCPAddr() net.Addr { return d.tcpAddr }

// listenUnix opens the socket, mode 0600 in a 0700 directory, refusing to take over a
// socket another daemon still answers on and replacing a stale one.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating the socket's directory: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("%w: another roched already listens on %s: stop it (roche daemon stop) or pass --socket",
			roche.ErrUnavailable, path)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%w: %s exists and is not a socket: remove it or pass another --socket", roche.ErrInvalidConfig, path)
		}
		os.Remove(path) // a dead daemon's socket
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("%w: listening on %s: %v", roche.ErrUnavailable, path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("restricting %s to its owner: %w", path, err)
	}
	return l, nil
}

// handler is the daemon's HTTP handler: the API, /healthz and /metrics, behind the
// token check when asked.
func (d *Daemon) handler(requireToken bool) http.Handler {
	mux := d.apiMux()
	mux.HandleFunc("/healthz", d.healthz)
	mux.Handle("/metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{}))
	if !requireToken {
		// The E2B listener's environment, for its socket's owner alone (roche e2b env).
		mux.HandleFunc("/e2b/env", d.frontendEnv)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			t := d.local
			if ownUser, _ := r.Context().Value(ownUserKey{}).(bool); ownUser {
				t = d.ownUser
			}
			mux.ServeHTTP(w, r.WithContext(withTenant(r.Context(), t)))
		})
	}
	if d.cfg.UI {
		d.consoleMux(mux)
	}
	return d.authenticate(mux)
}

// apiMux serves the API and its reflection; the caller sets the tenant.
func (d *Daemon) apiMux() *http.ServeMux {
	mux := http.NewServeMux()
	opts := append(strictCodecs(),
		// Local clients gain nothing from compressing small messages.
		connect.WithCompressMinBytes(32<<10),
		connect.WithReadMaxBytes(maxMessageBytes),
	)
	if d.traces != nil {
		// Outermost, so that the span covers every other interceptor's refusal too.
		opts = append(opts, connect.WithInterceptors(tracingInterceptor{tr: d.traces.Tracer(tracerName)}))
	}
	opts = append(opts, connect.WithInterceptors(uploadLimit{max: cmp.Or(d.cfg.MaxUploadBytes, wire.MaxUploadBytes)}))
	path, h := rochev1connect.NewSandboxServiceHandler(&service{d: d}, opts...)
	mux.Handle(path, d.releaseHeld(uncompressedFiles(h)))
	// Server reflection, so that grpcurl and buf curl list and call the methods without
	// the .proto at hand; behind the same token check as the API.
	reflector := grpcreflect.NewStaticReflector(rochev1connect.SandboxServiceName)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	return mux
}

// ownUserKey marks, in a unix socket connection's context, a caller that runs as
// roched's own user.
type ownUserKey struct{}

// ownUserConn is the unix listener's ConnContext: it reads the caller's uid once per
// connection (SO_PEERCRED) and marks the caller that runs as roched's own user. root
// calling another user's roched, or a user let onto the socket by a changed mode, is
// the local tenant without that user's direct-mode sandboxes.
func ownUserConn(ctx context.Context, c net.Conn) context.Context {
	if uid, ok := peerUID(c); ok && uid == uint32(os.Getuid()) {
		return context.WithValue(ctx, ownUserKey{}, true)
	}
	return ctx
}

// maxMessageBytes bounds a request: an Exec carries its stdin whole (roche.MaxStdinBytes,
// a third more as base64 in JSON), with argv and env besides.
const maxMessageBytes = 24 << 20

// authenticate requires a tenant's bearer token on everything but /healthz (its
// ?verbose report, which tells the host's paths and versions, needs one), answering
// API calls with UNAUTHENTICATED in whichever protocol they speak. The token's hash is
// compared with every tenant's in constant time.
func (d *Daemon) authenticate(next http.Handler) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := sameOrigin(r); err != nil {
			d.log.Warn("cross-origin request refused", "path", r.URL.Path, "remote", r.RemoteAddr, "origin", r.Header.Get("Origin"))
			permissionDenied(w, r, err)
			return
		}
		if r.URL.Path == "/healthz" && !r.URL.Query().Has("verbose") || d.cfg.UI && consolePage(r) {
			next.ServeHTTP(w, r)
			return
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		t, why := d.callerTenant(r.TLS, token, ok)
		if d.cfg.UI && !ok {
			// The console's session cookie (console_login.go), when no token is sent.
			if st, found, serr := d.sessionCaller(r); found {
				t, why = st, serr
				r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, true))
			}
		}
		if why == nil {
			if t.readOnly && !readOnlyAllows(r) {
				d.log.Warn("call refused to a read-only tenant", "tenant", t.Name, "path", r.URL.Path, "remote", r.RemoteAddr)
				permissionDenied(w, r, fmt.Errorf("%w: tenant %s is read-only: it may list and look, not run, change or destroy (%s)", roche.ErrPermission, t.Name, r.URL.Path))
				return
			}
			next.ServeHTTP(w, r.WithContext(withTenant(r.Context(), t)))
			return
		}
		d.log.Warn("unauthenticated request refused", "path", r.URL.Path, "remote", r.RemoteAddr, "why", why)
		err := connect.NewError(connect.CodeUnauthenticated, why)
		if ew.IsSupported(r) {
			_ = ew.Write(w, r, err)
			return
		}
		http.Error(w, err.Message(), http.StatusUnauthorized)
	})
}

// Shutdown stops serving (waiting for calls in progress until ctx ends, then cutting
// them off), then closes the ledger: it drains the pools, finishes pending removals and
// saves the state. The sandboxes clients hold are left running for the next daemon to
// adopt.
func (d *Daemon) Shutdown(ctx context.Context) error {
	var errs []error
	d.shutdown.Do(func() {
		d.log.Info("roched shutting down")
		close(d.draining)
		for _, srv := range d.servers {
			if err := srv.Shutdown(ctx); err != nil {
				srv.Close()
				errs = append(errs, fmt.Errorf("stopping calls in progress: %w", err))
			}
		}
		d.bg.Wait()
		n, err := d.ledger.Close(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		d.stopEgress()
		if d.traces != nil {
			// The spans still batched are sent before roched exits.
			if err := d.traces.Shutdown(ctx); err != nil {
				d.log.Warn("sending the last traces", "err", err)
			}
		}
		d.log.Info("roched stopped", "pool_sandboxes_destroyed", n)
	})
	return errors.Join(errs...)
}

// OwnerOf is the owner the daemon gives the sandboxes of the named tenant.
func (d *Daemon) OwnerOf(tenant string) string { return d.ledger.OwnerOf(tenant) }
