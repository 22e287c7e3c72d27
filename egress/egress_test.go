package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server is a local HTTP(S) server on a loopback address of its own that counts the
// connections it receives.
type server struct {
	*httptest.Server
	conns atomic.Int64
}

func newServer(t *testing.T, ip string, tlsOn bool) *server {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("listening on %s: %v", ip, err)
	}
	s := &server{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s %s", r.Host, r.URL.Path)
	}))
	s.Listener = ln
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	if tlsOn {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// startProxy serves a proxy on a loopback port and returns its URL.
func startProxy(t *testing.T, opts Options, rules ...string) (*Proxy, *url.URL) {
	t.Helper()
	pol, err := ParsePolicy(rules)
	if err != nil {
		t.Fatal(err)
	}
	opts.Policy = pol
	p := New(opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Serve(ln); close(done) }()
	t.Cleanup(func() { ln.Close(); p.Close(); <-done })
	u, _ := url.Parse("http://" + ln.Addr().String())
	return p, u
}

func client(proxy *url.URL, roots *tls.Config) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: roots, DisableKeepAlives: true}
	return &http.Client{Transport: tr}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAllowedHTTP(t *testing.T) {
	s := newServer(t, "127.0.0.2", false)
	_, proxy := startProxy(t, Options{}, s.Listener.Addr().String())
	code, body := get(t, client(proxy, nil), s.URL+"/pkg")
	if code != 200 || !strings.Contains(body, "hello from "+s.Listener.Addr().String()+" /pkg") {
		t.Fatalf("allowed HTTP: %d %q", code, body)
	}
}

func TestAllowedHTTPSThroughConnect(t *testing.T) {
	s := newServer(t, "127.0.0.3", true)
	_, proxy := startProxy(t, Options{}, s.Listener.Addr().String())
	c := s.Client()
	tr := c.Transport.(*http.Transport)
	tr.Proxy = http.ProxyURL(proxy)
	// httptest's certificate names 127.0.0.1 and example.com, not 127.0.0.3: checked
	// as the first, with no TLS name sent (the proxy refuses a TLS name other than the
	// CONNECT's, TestSNIDifferingFromConnectRefused).
	tr.TLSClientConfig.InsecureSkipVerify = true
	tr.TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		return cs.PeerCertificates[0].VerifyHostname("127.0.0.1")
	}
	resp, err := c.Get(s.URL + "/secure")
	if err != nil {
		t.Fatalf("HTTPS through CONNECT: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "/secure") {
		t.Fatalf("HTTPS through CONNECT: %d %q", resp.StatusCode, b)
	}
}

func TestUnlistedHostRefusedWithoutConnecting(t *testing.T) {
	allowed := newServer(t, "127.0.0.2", false)
	other := newServer(t, "127.0.0.4", false)
	tlsOther := newServer(t, "127.0.0.5", true)
	_, proxy := startProxy(t, Options{}, allowed.Listener.Addr().String())
	code, body := get(t, client(proxy, nil), other.URL+"/")
	if code != http.StatusForbidden || !strings.Contains(body, "not in this sandbox's allowlist") {
		t.Fatalf("unlisted HTTP host: %d %q, want 403", code, body)
	}
	c := tlsOther.Client()
	c.Transport.(*http.Transport).Proxy = http.ProxyURL(proxy)
	if _, err := c.Get(tlsOther.URL); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("unlisted HTTPS host: %v, want a refused CONNECT", err)
	}
	if n := other.conns.Load() + tlsOther.conns.Load(); n != 0 {
		t.Fatalf("%d connections reached unlisted servers", n)
	}
	// Same address, another port: not allowed either.
	code, _ = get(t, client(proxy, nil), "http://127.0.0.2:1/")
	if code != http.StatusForbidden {
		t.Fatalf("allowed host, unlisted port: %d", code)
	}
}

// fakeResolver answers from a map; dialer records what was dialled.
type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func TestNamesResolvingToPrivateAddressesRefused(t *testing.T) {
	var dialled atomic.Int64
	res := fakeResolver{
		"metadata.example": {netip.MustParseAddr("169.254.169.254")},
		"internal.example": {netip.MustParseAddr("10.0.0.1")},
		"mixed.example":    {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("192.168.1.1")},
		"loop.example":     {netip.MustParseAddr("127.0.0.1")},
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialled.Add(1)
		return nil, errors.New("test dialer: no network")
	}
	_, proxy := startProxy(t, Options{Resolver: res, Dial: dial},
		"metadata.example", "internal.example", "mixed.example", "loop.example", "*.example")
	for host, want := range map[string]string{
		"metadata.example": "cloud metadata", "internal.example": "10.0.0.0/8, Private-Use", "mixed.example": "192.168.0.0/16, Private-Use", "loop.example": "127.0.0.0/8, Loopback",
	} {
		code, body := get(t, client(proxy, nil), "http://"+host+"/")
		if code != http.StatusForbidden || !strings.Contains(body, want) {
			t.Errorf("%s: %d %q, want 403 naming %s", host, code, body, want)
		}
	}
	// Literal private addresses that no entry names are refused too.
	code, _ := get(t, client(proxy, nil), "http://169.254.169.254/latest/meta-data/")
	if code != http.StatusForbidden {
		t.Errorf("metadata IP: %d, want 403", code)
	}
	if n := dialled.Load(); n != 0 {
		t.Fatalf("the proxy dialled %d times for refused targets", n)
	}
}

func TestHostHeaderMismatchRefused(t *testing.T) {
	allowed := newServer(t, "127.0.0.2", false)
	evil := newServer(t, "127.0.0.6", false)
	_, proxy := startProxy(t, Options{}, allowed.Listener.Addr().String())
	for _, req := range []string{
		"CONNECT " + allowed.Listener.Addr().String() + " HTTP/1.1\r\nHost: " + evil.Listener.Addr().String() + "\r\n\r\n",
		"GET http://" + allowed.Listener.Addr().String() + "/ HTTP/1.1\r\nHost: evil.example\r\n\r\n",
	} {
		c, err := net.Dial("tcp", proxy.Host)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("%q: %v %v, want 403", req, resp, err)
		}
	}
	if n := allowed.conns.Load() + evil.conns.Load(); n != 0 {
		t.Fatalf("%d connections made for mismatched Host headers", n)
	}
}

func TestCaps(t *testing.T) {
	s := newServer(t, "127.0.0.2", false)
	p, proxy := startProxy(t, Options{MaxBytes: 300}, s.Listener.Addr().String())
	c := client(proxy, nil)
	if code, _ := get(t, c, s.URL+"/a"); code != 200 {
		t.Fatalf("first request under the byte cap: %d", code)
	}
	for i := 0; i < 5; i++ {
		get(t, c, s.URL+"/b")
	}
	if code, body := get(t, c, s.URL+"/c"); code != http.StatusForbidden || !strings.Contains(body, "bytes") {
		t.Fatalf("past the byte cap: %d %q", code, body)
	}
	if p.Bytes() < 300 {
		t.Fatalf("counted %d bytes", p.Bytes())
	}

	// Connection cap: hold one CONNECT open, the next is refused.
	_, proxy = startProxy(t, Options{MaxConns: 1}, s.Listener.Addr().String())
	held, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	io.WriteString(held, "CONNECT "+s.Listener.Addr().String()+" HTTP/1.1\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(held), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first CONNECT: %v %v", resp, err)
	}
	// The proxy refuses a connection past the cap as it accepts it, before any request:
	// read that answer on a bare connection (an HTTP client, still writing its request,
	// may find the answer unsolicited or the connection reset).
	second, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	resp, err := http.ReadResponse(bufio.NewReader(second), nil)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second connection past the cap: %v %v, want 429", resp, err)
	}
}

func TestParseRule(t *testing.T) {
	good := map[string]string{
		"pypi.org": "pypi.org", "*.npmjs.org": "*.npmjs.org", "Example.com:8443": "example.com:8443",
		"127.0.0.2:8080": "127.0.0.2:8080", "[::1]:8443": "[::1]:8443", "10.0.0.1": "10.0.0.1",
	}
	for in, want := range good {
		r, err := ParseRule(in)
		if err != nil || r.String() != want {
			t.Errorf("ParseRule(%q) = %v, %v; want %s", in, r, err, want)
		}
	}
	for _, bad := range []string{"", "http://pypi.org", "pypi.org/simple", "https://pypi.org?x", "https://u@pypi.org/", "https://pypi.org/a/../b",
		"https://pypi.org/%2e%2e/", "GET POST https://pypi.org/", "CONNECT https://pypi.org/", "https://", "pypi.org:0", "pypi.org:99999", "*", "*.", "a*b.com", "nodots"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
	for in, want := range map[string]string{
		"https://api.example.com":                    "https://api.example.com/",
		"get,Head  https://API.example.com:8443/v1/": "GET,HEAD https://api.example.com:8443/v1/",
		"POST https://127.0.0.2:9000/x":              "POST https://127.0.0.2:9000/x",
	} {
		r, err := ParseRule(in)
		if err != nil || r.String() != want || !r.Intercept {
			t.Errorf("ParseRule(%q) = %v, %v; want %s", in, r, err, want)
		}
	}
	pol, _ := ParsePolicy([]string{"pypi.org", "*.npmjs.org", "example.com:8443"})
	for _, c := range []struct {
		host        string
		port, def   int
		wantAllowed bool
	}{
		{"pypi.org", 443, 443, true}, {"PyPI.org.", 80, 80, true}, {"files.pypi.org", 443, 443, false},
		{"registry.npmjs.org", 443, 443, true}, {"npmjs.org", 443, 443, false}, {"evilnpmjs.org", 443, 443, false},
		{"example.com", 8443, 443, true}, {"example.com", 443, 443, false}, {"pypi.org", 8080, 443, false},
	} {
		if _, ok := pol.match(c.host, c.port, c.def); ok != c.wantAllowed {
			t.Errorf("%s:%d allowed %v, want %v", c.host, c.port, ok, c.wantAllowed)
		}
	}
}
