// Package client talks to roched, Roche's daemon, over its unix socket (or TCP with a
// token). Client.Provider returns a roche.Provider (also a FileCopier, Pauser,
// GarbageCollector, Resetter, WorkspaceManager and Snapshotter) backed by the daemon, so
// a program can switch between a daemon and an in-process provider without other changes:
//
//	c, err := client.New() // the default socket; client.WithSocket(path) for another
//	if err != nil { ... }
//	defer c.Close()
//	var p roche.Provider = c.Provider("docker")
//	sb, err := p.Create(ctx, cfg) // served from the daemon's warm pool when it matches one
//
// Errors carry the daemon's message and wrap the same roche sentinels a provider would
// return in-process (roche.ErrNotFound, roche.ErrInvalidConfig, ...).
package client

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Client is a connection to a daemon. It is safe for concurrent use.
type Client struct {
	rpc       rochev1connect.SandboxServiceClient
	http      *http.Client
	transport *http.Transport
	base      string
	where     string // for messages: the socket path or the address
	// reached: a call has had an answer from roched, so a refused connection later is
	// roched restarting or a replica gone, which safe calls retry (retry.go).
	reached atomic.Bool

	mu   sync.Mutex
	caps map[string]roche.Capabilities
	// holds are the Hold streams of the leased sandboxes this client created (hold.go).
	holds map[string]context.CancelFunc
	// lost says why holds that ended on their own ended, oldest first in lostOrder.
	lost      map[string]error
	lostOrder []string
}

type options struct {
	socket  string
	address string
	token   string
	grpc    bool
	dial    func(ctx context.Context) (net.Conn, error)
	// TLS for an https:// address (tls.go).
	caFile, clientCert, clientKey string
	tlsConfig                     *tls.Config
}

// Option configures a Client.
type Option func(*options)

// WithSocket dials the daemon's unix socket at path (default DefaultSocket()).
func WithSocket(path string) Option { return func(o *options) { o.socket = path } }

// WithAddress reaches the daemon over TCP at a URL such as https://roche.example:7878
// (TLS, verified against the system's CAs or WithCAFile's) or http://127.0.0.1:7878
// (plaintext, which roched serves only on loopback unless --insecure) instead of the
// unix socket; such a daemon requires WithToken or WithClientCert.
func WithAddress(url string) Option { return func(o *options) { o.address = url } }

// WithToken sends "Authorization: Bearer token" with every request.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithDialer reaches the daemon on the connections dial opens instead of its socket: an
// in-process daemon's (roched's frontends, internal/daemon DialAs).
func WithDialer(dial func(ctx context.Context) (net.Conn, error)) Option {
	return func(o *options) { o.dial = dial }
}

// WithGRPC speaks gRPC (over cleartext HTTP/2) instead of the Connect protocol. Both
// reach the same handler; Connect works over HTTP/1.1 and is the default.
func WithGRPC() Option { return func(o *options) { o.grpc = true } }

// New returns a client. It does not connect: the first call does, and reports
// roche.ErrUnavailable when no daemon answers.
func New(opts ...Option) (*Client, error) {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	tr := &http.Transport{
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		// Compression costs more than it saves on a local socket.
		DisableCompression: true,
		// File content moves in messages of 256 KiB: buffers of a few KiB (the default)
		// cut each into many system calls.
		ReadBufferSize:  256 << 10,
		WriteBufferSize: 256 << 10,
	}
	c := &Client{transport: tr}
	var copts []connect.ClientOption
	if o.address != "" {
		if !strings.HasPrefix(o.address, "http://") && !strings.HasPrefix(o.address, "https://") {
			return nil, fmt.Errorf("%w: daemon address %q: use https://HOST:PORT (TLS) or http://HOST:PORT (plaintext, loopback)", roche.ErrInvalidConfig, o.address)
		}
		c.base, c.where = strings.TrimSuffix(o.address, "/"), o.address
		cfg, err := o.tlsSettings()
		if err != nil {
			return nil, err
		}
		if cfg != nil && !strings.HasPrefix(o.address, "https://") {
			return nil, fmt.Errorf("%w: a CA or client certificate is for TLS: use https://%s", roche.ErrInvalidConfig, strings.TrimPrefix(o.address, "http://"))
		}
		tr.TLSClientConfig = cfg
	} else {
		socket := o.socket
		if socket == "" {
			socket = DefaultSocket()
		}
		c.base, c.where = "http://roched", socket
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}
		if o.dial != nil {
			c.where = "roched (in-process)"
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return o.dial(ctx) }
		}
		// Nor connect's: roched gzips a message of 32 KiB or more for a client that
		// accepts it, and on a local socket that cost 7.6 times the time of a 16 MiB
		// command replay (bench/commands: 356 against 47 ms), files and exec streams alike.
		copts = append(copts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	if o.grpc {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
		tr.Protocols.SetHTTP2(true)
		copts = append(copts, connect.WithGRPC())
	}
	var rt http.RoundTripper = tr
	if o.token != "" {
		rt = bearer{token: o.token, next: tr}
	}
	rt = traceparent{next: rt}
	c.http = &http.Client{Transport: rt}
	c.rpc = rochev1connect.NewSandboxServiceClient(c.http, c.base, copts...)
	return c, nil
}

// bearer adds the token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// Close releases idle connections.
func (c *Client) Close() error {
	c.releaseAll()
	c.transport.CloseIdleConnections()
	return nil
}

// Where is the socket path or address the client talks to.
func (c *Client) Where() string { return c.where }

// Health is what GET /healthz reports (its one definition is internal/wire's, which
// roched writes).
type Health = wire.Health

// EngineHealth is whether a provider's engine answers, since when, and if not, why.
type EngineHealth = wire.EngineHealth

// Health asks the daemon whether it is up; roche.ErrUnavailable when nothing answers.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/healthz", nil)
	if err != nil {
		return h, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return h, c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return h, fmt.Errorf("%w: roched at %s answered /healthz with %s", roche.ErrUnavailable, c.where, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("%w: roched at %s sent a malformed /healthz: %v", roche.ErrUnavailable, c.where, err)
	}
	return h, nil
}

func (c *Client) unreachable(err error) error {
	if why := tlsProblem(c.where, err); why != "" {
		return &Error{Code: connect.CodeUnavailable, Message: why, sentinel: roche.ErrUnavailable}
	}
	return &Error{
		Code:     connect.CodeUnavailable,
		Message:  fmt.Sprintf("roched is not answering on %s: start it (roche daemon start) or use --direct: %v", c.where, err),
		sentinel: roche.ErrUnavailable,
	}
}

// Error is an error the daemon returned (or the failure to reach it). Its text is the
// daemon's message; errors.Is matches the roche sentinel behind it.
type Error struct {
	Code     connect.Code
	Message  string
	sentinel error
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.sentinel }

// fromRPC turns an RPC error back into one that wraps the core's sentinel.
func (c *Client) fromRPC(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	e := &Error{Code: ce.Code(), Message: ce.Message()}
	sentinel, withDetail := wire.FromStatus(ce)
	// Without a detail, UNAVAILABLE comes from the transport: no daemon answered.
	if !withDetail && tlsProblem(c.where, err) != "" {
		return c.unreachable(err)
	}
	if !withDetail && ce.Code() == connect.CodeUnavailable {
		return c.unreachable(errors.New(ce.Message()))
	}
	e.sentinel = sentinel
	if e.Message == "" {
		e.Message = err.Error()
	}
	if after, ok := wire.RetryDelay(ce); ok {
		return kit.RetryAfter(e, after)
	}
	return e
}

// lostDuringCommand is fromRPC for a command's call: when the connection to roched
// broke after the call was made (roched killed, or its connection cut), the caller hears
// that, what became of the command (roche-agent stops a command whose caller's
// connection is gone, and roched was its caller) and that the sandbox itself lives on,
// not connect's "protocol error: incomplete envelope".
func (c *Client) lostDuringCommand(err error, id, key string) error {
	if !connectionLost(err) {
		return c.fromRPC(err)
	}
	var ce *connect.Error
	errors.As(err, &ce)
	if key != "" {
		return &Error{
			Code: connect.CodeUnavailable,
			Message: fmt.Sprintf("roched went away while the command ran in sandbox %s (%s: %s): the command goes on in the sandbox; "+
				"call again with the same idempotency key once roched is back (roche daemon start) for its output and result",
				id, c.where, ce.Message()),
			sentinel: roche.ErrUnavailable,
		}
	}
	return &Error{
		Code: connect.CodeUnavailable,
		Message: fmt.Sprintf("roched went away while the command ran in sandbox %s (%s: %s): the command was stopped with it; "+
			"the sandbox stays, for roched to serve again once restarted (roche daemon start), unless it was held (roche run, create --hold), which ends within seconds",
			id, c.where, ce.Message()),
		sentinel: roche.ErrUnavailable,
	}
}

// connectionLost reports whether err is the connection to roched breaking during a call
// (the stream or the response cut off), as opposed to roched's own answer or a dial that
// found nobody.
func connectionLost(err error) bool {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return false
	}
	if _, withDetail := wire.FromStatus(ce); withDetail || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return false
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// ProviderInfo names a provider the daemon serves and what it supports.
type ProviderInfo struct {
	Name         string
	Capabilities roche.Capabilities
}

// Providers lists the providers the daemon serves.
func (c *Client) Providers(ctx context.Context) ([]ProviderInfo, error) {
	resp, err := c.rpc.ListProviders(ctx, connect.NewRequest(&rochev1.ListProvidersRequest{}))
	if err != nil {
		return nil, c.fromRPC(err)
	}
	out := make([]ProviderInfo, 0, len(resp.Msg.Providers))
	caps := map[string]roche.Capabilities{}
	for _, p := range resp.Msg.Providers {
		cp := wire.CapsFromProto(p.Capabilities)
		caps[p.Name] = cp
		out = append(out, ProviderInfo{Name: p.Name, Capabilities: cp})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	c.mu.Lock()
	c.caps = caps
	c.mu.Unlock()
	return out, nil
}

// PoolStatus reports the daemon's warm pools.
func (c *Client) PoolStatus(ctx context.Context) ([]*rochev1.Pool, error) {
	resp, err := c.rpc.PoolStatus(ctx, connect.NewRequest(&rochev1.PoolStatusRequest{}))
	if err != nil {
		return nil, c.fromRPC(err)
	}
	return resp.Msg.Pools, nil
}

// PoolWarmup fills the pool named by key ("provider/image"; every pool when empty) to
// count idle sandboxes (its minimum when 0), resuming a drained pool, and waits.
func (c *Client) PoolWarmup(ctx context.Context, key string, count int) ([]*rochev1.Pool, error) {
	resp, err := c.rpc.PoolWarmup(ctx, connect.NewRequest(&rochev1.PoolWarmupRequest{Key: key, Count: int32(count)}))
	if err != nil {
		return nil, c.fromRPC(err)
	}
	return resp.Msg.Pools, nil
}

// PoolDrain destroys the idle sandboxes of the pool named by key (every pool when
// empty) and stops refilling it until the next warmup. It returns how many it destroyed.
func (c *Client) PoolDrain(ctx context.Context, key string) (int, []*rochev1.Pool, error) {
	resp, err := c.rpc.PoolDrain(ctx, connect.NewRequest(&rochev1.PoolDrainRequest{Key: key}))
	if err != nil {
		return 0, nil, c.fromRPC(err)
	}
	return int(resp.Msg.Destroyed), resp.Msg.Pools, nil
}

// Create makes a sandbox on the named provider ("" for the daemon's default) and says
// whether it came from a warm pool.
func (c *Client) Create(ctx context.Context, provider string, cfg roche.Config) (roche.SandboxInfo, bool, error) {
	return c.CreateFor(ctx, provider, cfg, kit.CreateOptions{})
}

// CreateFor is Create with options. With opts.Leased the sandbox is tied to this client:
// it holds it (see Holding) until Destroy, Close or its end, and roched destroys it a
// few seconds after. opts.Owner is not sent: roched names the owner of what it makes
// (its own, for the caller's tenant), whoever asks. With opts.IdempotencyKey a create
// whose connection is lost is retried (RetryFor), and roched answers a repeated key with
// the sandbox the first attempt made.
func (c *Client) CreateFor(ctx context.Context, provider string, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, bool, error) {
	// Checked here too, so that the words are the ones an in-process provider uses (the
	// wire would first clamp an out-of-range number).
	if err := cfg.Validate(); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	req := &rochev1.CreateRequest{Provider: provider, Config: wire.ConfigToProto(cfg, opts.Leased), IdempotencyKey: opts.IdempotencyKey}
	create := func(bool) (*connect.Response[rochev1.CreateResponse], error) {
		return c.rpc.Create(ctx, connect.NewRequest(req))
	}
	var resp *connect.Response[rochev1.CreateResponse]
	var err error
	if opts.IdempotencyKey != "" {
		// Safe to repeat: a retry gets the sandbox the first attempt made, if it did.
		resp, err = retrying(ctx, c, create)
	} else {
		resp, err = create(false)
	}
	if err != nil {
		return roche.SandboxInfo{}, false, c.fromRPC(err)
	}
	sb := wire.InfoFromProto(resp.Msg.Sandbox)
	if opts.Leased {
		c.hold(sb.ID)
	}
	return sb, resp.Msg.Pooled, nil
}

// DestroyAll destroys every sandbox handed to clients (of provider, when given) and
// returns their ids; the pools' idle sandboxes are left alone.
func (c *Client) DestroyAll(ctx context.Context, provider string) ([]string, error) {
	resp, err := c.rpc.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{All: true, Provider: provider}))
	if err != nil {
		return nil, c.fromRPC(err)
	}
	// The providers roched could not ask: their sandboxes are still there.
	return resp.Msg.Destroyed, wire.SkippedFromProto(resp.Msg.Skipped)
}
