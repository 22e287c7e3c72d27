package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/roche-sandbox/roche/internal/localca"
)

// RootsEnv names a PEM file of extra roots the proxy trusts, beside the host's, when it
// verifies an intercepted connection's upstream (tests give their test CA).
const RootsEnv = "ROCHE_EGRESS_ROOTS"

// NewCA makes the CA of one sandbox, which signs the certificates the proxy shows the
// sandbox on intercepted connections. Its key stays in this process; only its
// certificate (CA.CertPEM) goes into the sandbox.
func NewCA(sandbox string) (*localca.CA, error) {
	return localca.New("Roche egress CA for sandbox "+sandbox, 30*24*time.Hour)
}

// UpstreamRoots returns the host's trust store and the roots in the file RootsEnv
// names, if it is set.
func UpstreamRoots() (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if f := os.Getenv(RootsEnv); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", RootsEnv, err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", RootsEnv, f)
		}
	}
	return pool, nil
}

// HostRootsPEM returns the host's trust store as PEM, from the first bundle file found
// in the usual places (nil if none): a sandbox whose trust store is replaced by its CA's
// gets these beside it.
func HostRootsPEM() []byte {
	for _, f := range []string{
		"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
		"/etc/ssl/ca-bundle.pem", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/ssl/cert.pem",
	} {
		if b, err := os.ReadFile(f); err == nil && len(b) > 0 {
			return b
		}
	}
	return nil
}

// leafs are the certificates a proxy's CA signed, by host, made on first use.
type leafs struct {
	mu    sync.Mutex
	certs map[string]*tls.Certificate
}

func (p *Proxy) leaf(host string) (*tls.Certificate, error) {
	p.leafs.mu.Lock()
	defer p.leafs.mu.Unlock()
	if c := p.leafs.certs[host]; c != nil && time.Now().Before(c.Leaf.NotAfter.Add(-time.Hour)) {
		return c, nil
	}
	now := time.Now()
	end := now.Add(7 * 24 * time.Hour)
	if na := p.opts.CA.Cert.NotAfter; na.Before(end) {
		end = na
	}
	l, err := p.opts.CA.Server([]string{host}, now.Add(-time.Minute), end)
	if err != nil {
		return nil, err
	}
	c, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	if err != nil {
		return nil, err
	}
	if p.leafs.certs == nil {
		p.leafs.certs = map[string]*tls.Certificate{}
	}
	p.leafs.certs[host] = &c
	return &c, nil
}

// CanIntercept reports whether the proxy has a CA, which https:// entries need.
func (p *Proxy) CanIntercept() bool { return p.opts.CA != nil }

func (p *Proxy) upstreamRoots() (*x509.CertPool, error) {
	p.rootsOnce.Do(func() {
		if p.opts.Roots != nil {
			p.roots = p.opts.Roots
			return
		}
		p.roots, p.rootsErr = UpstreamRoots()
	})
	return p.roots, p.rootsErr
}

// intercept serves an allowed CONNECT to host:port whose TLS the proxy terminates: it
// shows the sandbox a certificate for host signed by the sandbox's CA (refusing a TLS
// name other than host), checks every request inside (HTTP/1.1 or HTTP/2) against the
// policy, brokers secrets, and re-originates each allowed one to the address checked,
// verifying the upstream's certificate for host against the host's roots. Each request
// is a decision of its own; d, the CONNECT's, counts the bytes of all.
func (p *Proxy) intercept(c net.Conn, br *bufio.Reader, d *Decision, host string, port int, addr string, first net.Conn, ctr *counter) error {
	if p.opts.CA == nil {
		return errors.New("this sandbox has no CA to intercept with")
	}
	roots, err := p.upstreamRoots()
	if err != nil {
		return err
	}
	cert, err := p.leaf(host)
	if err != nil {
		return err
	}
	var sniErr error
	tc := tls.Server(&bufConn{Conn: c, r: br}, &tls.Config{
		Certificates: []tls.Certificate{*cert},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			if h.ServerName != "" && !strings.EqualFold(strings.TrimSuffix(h.ServerName, "."), host) {
				sniErr = fmt.Errorf("the TLS name %q differs from the CONNECT target %q", h.ServerName, host)
				return nil, sniErr
			}
			return nil, nil
		},
	})
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := tc.Handshake(); err != nil {
		if sniErr != nil {
			return sniErr
		}
		return fmt.Errorf("TLS handshake with the sandbox: %w", err)
	}
	_ = c.SetDeadline(time.Time{})

	var once sync.Once
	authority := net.JoinHostPort(host, strconv.Itoa(port))
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var conn net.Conn
			once.Do(func() { conn, first = first, nil })
			if conn != nil {
				return conn, nil
			}
			// Always the address checked, whatever the request names.
			up, err := p.opts.Dial(ctx, "tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
			if err != nil {
				return nil, err
			}
			if !p.track(up) {
				up.Close()
				return nil, net.ErrClosed
			}
			return &countingConn{Conn: up, p: p, ctr: ctr, untrack: true}, nil
		},
		TLSClientConfig:     &tls.Config{RootCAs: roots, ServerName: host, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 4,
		MaxConnsPerHost:     8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	defer once.Do(func() { // the first upstream connection, if no request took it
		first.Close()
		first = nil
	})
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "https", authority, pr.In.Host
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, "roche egress: reaching "+authority+": "+err.Error(), http.StatusBadGateway)
		},
		ErrorLog: discardLog,
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A request's decision is final at once; its bytes count in its connection's.
		rd := &Decision{Time: time.Now(), Sandbox: d.Sandbox, Host: host, Port: port, Addr: d.Addr, Method: r.Method, Path: r.URL.Path, Done: true}
		deny := func(status int, msg string) {
			rd.Reason = msg
			p.decide(rd)
			notify(*rd)
			http.Error(w, "roche egress: "+msg, status)
		}
		rh, rport, err := splitAuthority(r.Host, 443)
		if err != nil || !strings.EqualFold(strings.TrimSuffix(rh, "."), host) || rport != port {
			deny(http.StatusMisdirectedRequest, fmt.Sprintf("the request names %q inside a connection to %s", r.Host, authority))
			return
		}
		if r.Method == http.MethodConnect {
			deny(http.StatusMethodNotAllowed, "CONNECT inside an intercepted connection is refused")
			return
		}
		if !cleanPath(r.URL.Path) {
			deny(http.StatusBadRequest, fmt.Sprintf("the path %q holds an empty, \".\" or \"..\" segment, which a path rule cannot judge", r.URL.Path))
			return
		}
		rule, ok := p.Policy().matchRequest(host, port, r.Method, r.URL.Path)
		if !ok {
			rd.Rule = r.Method + " https://" + neededRule(host, port, 443) + r.URL.Path
			deny(http.StatusForbidden, fmt.Sprintf("%s %s on %s is not allowed by this sandbox's rules", r.Method, r.URL.Path, authority))
			return
		}
		rd.Rule = rule.String()
		if err := p.substitute(r.Header, r.URL, host, port, true); err != nil {
			deny(http.StatusForbidden, err.Error())
			return
		}
		rd.Allowed, rd.Reason = true, "allowed by "+rule.String()
		p.decide(rd)
		notify(*rd)
		rp.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: discardLog}
	ln := newOneConnListener(tc)
	srv.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed || st == http.StateHijacked {
			ln.done()
		}
	}
	_ = srv.Serve(ln)
	return nil
}

var discardLog = log.New(io.Discard, "", 0)

// bufConn reads what a bufio.Reader already holds before the rest of the connection.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// oneConnListener hands http.Server one connection, then waits for it to end.
type oneConnListener struct {
	c      net.Conn
	mu     sync.Mutex
	given  bool
	closed chan struct{}
	once   sync.Once
}

func newOneConnListener(c net.Conn) *oneConnListener {
	return &oneConnListener{c: c, closed: make(chan struct{})}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.given {
		l.given = true
		l.mu.Unlock()
		return l.c, nil
	}
	l.mu.Unlock()
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConnListener) done()          { l.once.Do(func() { close(l.closed) }) }
func (l *oneConnListener) Close() error   { l.done(); return nil }
func (l *oneConnListener) Addr() net.Addr { return l.c.LocalAddr() }

// peekSNI reads the TLS ClientHello the sandbox sends first in a tunnel and returns its
// server name, and the bytes read, to be replayed upstream. isTLS is false when the
// tunnel does not start with a TLS handshake record.
func peekSNI(c net.Conn, br *bufio.Reader) (sni string, isTLS bool, read []byte, err error) {
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	b, err := br.Peek(1)
	if err != nil {
		return "", false, nil, err
	}
	if b[0] != 0x16 { // not a TLS handshake record
		return "", false, nil, nil
	}
	var buf bytes.Buffer
	errStop := errors.New("stop")
	seen := false
	tc := tls.Server(readOnlyConn{r: io.TeeReader(br, &buf)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni, seen = h.ServerName, true
			return nil, errStop
		},
	})
	_ = tc.Handshake()
	if !seen {
		return "", true, buf.Bytes(), errors.New("the tunnel does not start with a TLS ClientHello the proxy can read")
	}
	return sni, true, buf.Bytes(), nil
}

// readOnlyConn is a net.Conn that reads from r and refuses writes, for parsing a
// ClientHello without answering it.
type readOnlyConn struct {
	net.Conn
	r io.Reader
}

func (c readOnlyConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c readOnlyConn) Write(p []byte) (int, error)      { return 0, io.ErrClosedPipe }
func (c readOnlyConn) Close() error                     { return nil }
func (c readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (c readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (c readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
func (c readOnlyConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c readOnlyConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
