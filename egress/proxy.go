package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/roche-sandbox/roche/internal/localca"
)

// Defaults for the per-sandbox caps.
const (
	DefaultMaxBytes = 1 << 30 // bytes in and out, over the sandbox's life
	DefaultMaxConns = 32      // connections at once
)

// Resolver looks up a host's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configures a Proxy.
type Options struct {
	Policy Policy
	// MaxBytes caps the bytes relayed in both directions over the proxy's life.
	MaxBytes int64
	// MaxConns caps the connections open at once.
	MaxConns int
	// Resolver resolves names (default net.DefaultResolver); the proxy never lets the
	// sandbox resolve anything itself.
	Resolver Resolver
	// Dial opens upstream connections (default a net.Dialer with a 10 s timeout).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HostAddrs lists the addresses on this host's interfaces, which no name may resolve
	// to. It is called at every decision, so an address added a moment ago counts
	// (default: the kernel's list, tens of microseconds a call).
	HostAddrs func() ([]netip.Addr, error)
	// now is the clock of the log rate limits (tests set it).
	now func() time.Time
	// Sandbox names the sandbox in logs; a non-empty one is its id, which Lookup finds
	// the proxy by (SetSandbox sets it later).
	Sandbox string
	Log     *slog.Logger
	// LogSize bounds the decision log (default DefaultLogSize).
	LogSize int
	// CA signs the certificates shown to the sandbox on intercepted connections (rules
	// given as https:// URLs, hosts secrets are bound to); without one they are refused.
	CA *localca.CA
	// Roots verify the upstreams of intercepted connections (default UpstreamRoots).
	Roots *x509.CertPool
	// Secrets are brokered to the hosts each is bound to.
	Secrets []Secret
}

// Proxy relays one sandbox's HTTP and CONNECT requests to the hosts its policy allows.
type Proxy struct {
	opts    Options
	log     *slog.Logger
	bytes   atomic.Int64
	conns   chan struct{}
	checker checker
	// Decision lines are rate-limited per sandbox, refusals and allowed apart, so that
	// a flood of allowed requests cannot hide the refusals.
	refusedLog, allowedLog *logLimiter

	dlog decisionLog

	mu      sync.Mutex
	closed  bool
	open    map[net.Conn]struct{}
	sandbox string
	policy  Policy   // changed live by Allow and Remove
	secrets []Secret // values changed live by SetSecret

	leafs     leafs
	rootsOnce sync.Once
	roots     *x509.CertPool
	rootsErr  error
}

// New returns a proxy for one sandbox.
func New(opts Options) *Proxy {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.Resolver == nil {
		opts.Resolver = net.DefaultResolver
	}
	if opts.Dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		opts.Dial = d.DialContext
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	ck := checker{hostAddrs: opts.HostAddrs}
	if ck.hostAddrs == nil {
		ck.hostAddrs, ck.hostName = interfaceAddrs, interfaceName
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	if opts.LogSize <= 0 {
		opts.LogSize = DefaultLogSize
	}
	p := &Proxy{
		opts: opts, log: opts.Log.With("sandbox", opts.Sandbox),
		conns:      make(chan struct{}, opts.MaxConns),
		checker:    ck,
		refusedLog: newLogLimiter(refusedLogBurst, refusedLogEvery, opts.now),
		allowedLog: newLogLimiter(allowedLogBurst, allowedLogEvery, opts.now),
		open:       map[net.Conn]struct{}{},
		dlog:       decisionLog{size: opts.LogSize},
		policy:     Policy{Rules: slices.Clone(opts.Policy.Rules)},
		secrets:    slices.Clone(opts.Secrets),
	}
	p.SetSandbox(opts.Sandbox)
	return p
}

// Policy returns the allowlist in force now.
func (p *Proxy) Policy() Policy {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Policy{Rules: slices.Clone(p.policy.Rules)}
}

// Allow adds rules to the allowlist (those it has already are kept once), from the next
// connection on.
func (p *Proxy) Allow(rules ...Rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range rules {
		if !slices.ContainsFunc(p.policy.Rules, func(q Rule) bool { return q.String() == r.String() }) {
			p.policy.Rules = append(p.policy.Rules, r)
		}
	}
}

// Remove takes rules out of the allowlist, from the next connection on (connections
// already open stay open), and returns those it did not have.
func (p *Proxy) Remove(rules ...Rule) (missing []Rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range rules {
		n := len(p.policy.Rules)
		p.policy.Rules = slices.DeleteFunc(p.policy.Rules, func(q Rule) bool { return q.String() == r.String() })
		if len(p.policy.Rules) == n {
			missing = append(missing, r)
		}
	}
	return missing
}

// Serve accepts connections on ln until it is closed.
func (p *Proxy) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go p.ServeConn(c)
	}
}

// Close ends every relayed connection, and logs how many decision lines the rate limits
// dropped since the last ones written.
func (p *Proxy) Close() {
	// Unregistered once closed is set, outside p.mu (SetSandbox takes the registry's lock
	// first): a SetSandbox racing Close cannot leave the closed proxy registered.
	defer p.unregister()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	for c := range p.open {
		c.Close()
	}
	refused, allowed := p.refusedLog.drain(), p.allowedLog.drain()
	if refused+allowed > 0 {
		p.log.Warn("egress log lines suppressed", "refused", refused, "allowed", allowed)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
}

// ServeConn handles one client connection: one CONNECT tunnel, or one plain HTTP request
// (the connection then closes, so that a kept-alive connection cannot carry a second
// request past the checks made for the first). Every request read is logged (Log), the
// refused ones too.
func (p *Proxy) ServeConn(c net.Conn) {
	defer c.Close()
	if !p.track(c) {
		return
	}
	defer p.untrack(c)
	d := &Decision{Time: time.Now(), Sandbox: p.Sandbox()}
	select {
	case p.conns <- struct{}{}:
		defer func() { <-p.conns }()
	default:
		p.refuse(c, d, http.StatusTooManyRequests, fmt.Sprintf("this sandbox already has %d connections open", p.opts.MaxConns))
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReaderSize(c, 64<<10)
	hostHeader, err := peekHost(br)
	if err != nil {
		p.refuse(c, d, http.StatusBadRequest, err.Error())
		return
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		p.refuse(c, d, http.StatusBadRequest, "malformed proxy request")
		return
	}
	_ = c.SetReadDeadline(time.Time{})

	d.Method = req.Method
	defaultPort := 80
	authority := req.URL.Host
	if req.Method == http.MethodConnect {
		defaultPort = 443
		authority = req.RequestURI
	} else {
		d.Path = req.URL.Path
		if req.URL.Scheme != "http" || req.URL.Host == "" {
			d.Host = strings.ToLower(req.URL.Host)
			p.refuse(c, d, http.StatusBadRequest, "only absolute http:// URLs and CONNECT are proxied")
			return
		}
	}
	host, port, err := splitAuthority(authority, defaultPort)
	if err != nil {
		d.Host = strings.ToLower(authority)
		p.refuse(c, d, http.StatusBadRequest, err.Error())
		return
	}
	d.Host, d.Port = host, port
	if hostHeader != "" {
		hh, hp, err := splitAuthority(hostHeader, defaultPort)
		if err != nil || !strings.EqualFold(hh, host) || hp != port {
			p.refuse(c, d, http.StatusForbidden, fmt.Sprintf("the Host header %q differs from the target %q", hostHeader, authority))
			return
		}
	}
	if err := p.substitute(req.Header, req.URL, host, port, false); err != nil {
		p.refuse(c, d, http.StatusForbidden, err.Error())
		return
	}
	rule, ok := p.Policy().match(host, port, defaultPort)
	if !ok {
		d.Rule = neededRule(host, port, defaultPort)
		p.refuse(c, d, http.StatusForbidden, fmt.Sprintf("%s is not in this sandbox's allowlist", net.JoinHostPort(host, strconv.Itoa(port))))
		return
	}
	addr, reason, err := p.resolve(req.Context(), host, rule)
	if addr.IsValid() {
		d.Addr = addr.String()
	}
	if err != nil {
		p.refuse(c, d, http.StatusBadGateway, fmt.Sprintf("cannot resolve %s: %v", host, err))
		return
	}
	if reason != "" {
		p.refuse(c, d, http.StatusForbidden, refusalText(host, addr, rule, reason))
		return
	}
	if p.bytes.Load() >= p.opts.MaxBytes {
		p.refuse(c, d, http.StatusForbidden, fmt.Sprintf("this sandbox has used its %d bytes of egress", p.opts.MaxBytes))
		return
	}
	up, err := p.opts.Dial(req.Context(), "tcp", net.JoinHostPort(addr.String(), strconv.Itoa(port)))
	if err != nil {
		p.refuse(c, d, http.StatusBadGateway, fmt.Sprintf("connecting to %s: %v", authority, err))
		return
	}
	if !p.track(up) {
		up.Close()
		return
	}
	counted := &countingConn{Conn: up, p: p, ctr: &counter{}, untrack: true}
	defer counted.Close()
	d.Rule, d.Allowed, d.Reason = rule.String(), true, "allowed by "+rule.String()+" at "+addr.String()
	var refused error
	defer func() {
		if refused == nil {
			final := p.dlog.update(d, func(d *Decision) {
				d.BytesOut, d.BytesIn, d.Done = counted.ctr.out.Load(), counted.ctr.in.Load(), true
			})
			notify(final)
		}
	}()
	if req.Method != http.MethodConnect {
		p.decide(d)
		p.forward(c, req, counted)
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		p.decide(d)
		return
	}
	if p.Policy().intercepted(host, port) || p.secretBound(host, port) {
		d.Reason += ", intercepted"
		p.decide(d)
		if err := p.intercept(c, br, d, host, port, addr.String(), counted, counted.ctr); err != nil {
			p.dlog.update(d, func(d *Decision) { d.Allowed, d.Reason = false, err.Error() })
		}
		return
	}
	// Not intercepted: the tunnel's TLS name must be the CONNECT's, so that an allowed
	// address answering for other names (a CDN) is not reached under them.
	sni, isTLS, read, err := peekSNI(c, br)
	if err == nil && isTLS && sni != "" && !strings.EqualFold(strings.TrimSuffix(sni, "."), host) {
		err = fmt.Errorf("the TLS name %q differs from the CONNECT target %q", sni, host)
	}
	if err != nil {
		refused = err
		d.Allowed, d.Reason = false, err.Error()
		p.decide(d)
		notify(*d)
		return
	}
	p.decide(d)
	p.pipe(c, io.MultiReader(bytes.NewReader(read), br), counted)
}

// neededRule is the allowlist entry that would allow host:port.
func neededRule(host string, port, defaultPort int) string {
	r := Rule{Host: host}
	if ip, err := netip.ParseAddr(host); err == nil {
		r.IP = ip
	}
	if port != defaultPort {
		r.Port = port
	}
	return r.String()
}

// refuse logs a refusal and answers the sandbox with it.
func (p *Proxy) refuse(c net.Conn, d *Decision, status int, msg string) {
	d.Reason = msg
	p.decide(d)
	notify(*d)
	refuse(c, status, msg)
}

// forward relays one plain HTTP request and its response.
func (p *Proxy) forward(c net.Conn, req *http.Request, up net.Conn) {
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization", "Connection", "Keep-Alive", "Upgrade", "Te", "Trailer"} {
		req.Header.Del(h)
	}
	req.RequestURI = ""
	req.Close = true
	if err := req.Write(up); err != nil {
		refuse(c, http.StatusBadGateway, "sending the request upstream: "+err.Error())
		return
	}
	resp, err := http.ReadResponse(bufio.NewReader(up), req)
	if err != nil {
		refuse(c, http.StatusBadGateway, "reading the upstream response: "+err.Error())
		return
	}
	defer resp.Body.Close()
	resp.Close = true
	_ = resp.Write(c)
}

// pipe copies both ways until either side closes.
func (p *Proxy) pipe(c net.Conn, br io.Reader, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(up, br) // br first: bytes the client sent right after CONNECT
		closeWrite(up)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		closeWrite(c)
		done <- struct{}{}
	}()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	if cc, ok := c.(*countingConn); ok {
		closeWrite(cc.Conn)
		return
	}
	c.Close()
}

// resolve picks the address to dial and says why it may not be, if it may not. A rule
// naming an IP allows exactly that IP, unless it is a cloud metadata address; for a name,
// every address it resolves to must be an ordinary public one (no special-purpose,
// metadata or host's own address), so a name cannot be pointed at the host or its
// neighbours.
func (p *Proxy) resolve(ctx context.Context, host string, rule Rule) (netip.Addr, string, error) {
	if rule.IP.IsValid() {
		return rule.IP, p.checker.refusal(rule.IP, true), nil
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return ip.Unmap(), p.checker.refusal(ip, false), nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := p.opts.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.Addr{}, "", err
	}
	if len(addrs) == 0 {
		return netip.Addr{}, "", errors.New("no addresses")
	}
	for _, a := range addrs {
		if why := p.checker.refusal(a, false); why != "" {
			return a, why, nil
		}
	}
	return addrs[0].Unmap(), "", nil
}

// refusalText is what the sandbox is told when a target resolves to a refused address.
func refusalText(host string, addr netip.Addr, rule Rule, why string) string {
	if rule.IP.IsValid() {
		return fmt.Sprintf("%s: no allowlist entry can open a cloud metadata address", why)
	}
	if strings.Trim(host, "[]") == addr.String() {
		return fmt.Sprintf("%s, which only an allowlist entry naming it literally can allow", why)
	}
	return fmt.Sprintf("%s resolves to %s: %s, which only an allowlist entry naming it literally can allow", host, addr, why)
}

// decide adds a decision to the log, and to the process's log within the sandbox's
// rate limits.
func (p *Proxy) decide(d *Decision) {
	p.dlog.add(d)
	target, why := d.Target(), d.Reason
	lim, level, msg := p.refusedLog, slog.LevelWarn, "egress refused"
	if d.Allowed {
		lim, level, msg = p.allowedLog, slog.LevelInfo, "egress allowed"
	}
	ok, dropped := lim.take()
	if !ok {
		return
	}
	args := []any{"target", target, "why", why}
	if dropped > 0 {
		args = append(args, "suppressed", dropped)
	}
	p.log.Log(context.Background(), level, msg, args...)
}

// Bytes reports the bytes relayed so far.
func (p *Proxy) Bytes() int64 { return p.bytes.Load() }

// counter counts the bytes of one decision, from and to the upstream.
type counter struct{ in, out atomic.Int64 }

// countingConn counts relayed bytes against the cap and cuts the connection past it.
type countingConn struct {
	net.Conn
	p       *Proxy
	ctr     *counter
	untrack bool // Close untracks the connection
	once    sync.Once
}

func (c *countingConn) Close() error {
	c.once.Do(func() {
		if c.untrack {
			c.p.untrack(c.Conn)
		}
	})
	return c.Conn.Close()
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.ctr.in.Add(int64(n))
	if c.p.bytes.Add(int64(n)) > c.p.opts.MaxBytes {
		c.Conn.Close()
		return n, errors.New("egress byte cap reached")
	}
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	if c.p.bytes.Add(int64(len(b))) > c.p.opts.MaxBytes {
		c.Conn.Close()
		return 0, errors.New("egress byte cap reached")
	}
	n, err := c.Conn.Write(b)
	c.ctr.out.Add(int64(n))
	return n, err
}

// refuse answers a proxy request with an error status and a one-line reason.
func refuse(c net.Conn, status int, msg string) {
	body := "roche egress: " + msg + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}

// peekHost returns the raw Host header of the next request without consuming it (Go's
// request parser replaces it by the URL's host, which would hide a mismatch). The head
// is read by the same textproto calls http.ReadRequest makes, so that the Host header
// checked is the one Go reads: its lines may end in "\n" as well as "\r\n", and a
// header may continue on the next line.
func peekHost(br *bufio.Reader) (string, error) {
	for {
		n := br.Buffered()
		b, _ := br.Peek(n)
		if end := headEnd(b); end >= 0 {
			tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(b[:end])))
			if _, err := tp.ReadLine(); err != nil {
				return "", errors.New("malformed proxy request")
			}
			hdr, err := tp.ReadMIMEHeader()
			if err != nil {
				return "", errors.New("malformed proxy request headers")
			}
			// More than one Host header: http.ReadRequest refuses the request.
			return strings.TrimSpace(hdr.Get("Host")), nil
		}
		if n >= br.Size() {
			return "", errors.New("request headers too large")
		}
		// Wait for at least one more byte than is buffered.
		if _, err := br.Peek(n + 1); err != nil {
			return "", errors.New("connection closed before the request was complete")
		}
	}
}

// headEnd is the length of a request's head in b, through the empty line that ends it,
// or -1 when b does not hold all of it yet. Lines end in "\n", a "\r" before it optional,
// as Go's parser reads them.
func headEnd(b []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		if i > 0 && (j == 0 || j == 1 && b[i] == '\r') {
			return i + j + 1
		}
		i += j + 1
	}
}

// splitAuthority splits host[:port], giving defaultPort when there is none.
func splitAuthority(a string, defaultPort int) (string, int, error) {
	host, ps, err := net.SplitHostPort(a)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return strings.Trim(strings.ToLower(a), "[]"), defaultPort, nil
		}
		return "", 0, fmt.Errorf("bad target %q", a)
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", a)
	}
	return strings.ToLower(host), port, nil
}
