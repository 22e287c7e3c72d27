package providertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// countingServer is a local HTTP(S) server on a loopback address of its own.
type countingServer struct {
	*httptest.Server
	conns atomic.Int64
}

func localServer(t *testing.T, ip string, tlsOn bool) *countingServer {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	s := &countingServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
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

// OKServer serves 200 "ok" to every request on ip (a loopback address of the test's
// own) until the test ends, and returns its host:port: a host for a sandbox's allowlist.
func OKServer(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}

// GetEach, run in a sandbox as python3 -c GetEach URL..., sends a GET to each URL, going
// on past a refusal, and prints the statuses on one line ("200 403").
const GetEach = `import sys, urllib.request, urllib.error
out = []
for u in sys.argv[1:]:
    try:
        out.append(str(urllib.request.urlopen(u, timeout=10).status))
    except urllib.error.HTTPError as e:
        out.append(str(e.code))
print(' '.join(out))`

// egressProbe runs inside the sandbox and reports, as JSON, what each attempt got.
const egressProbe = `
import json, socket, ssl, sys, urllib.request, urllib.error
http_addr, tls_addr, other_addr, local_port = sys.argv[1:5]
out = {}
def attempt(name, fn):
    try:
        out[name] = 'ok: ' + fn()
    except urllib.error.HTTPError as e:
        out[name] = 'http %d: %s' % (e.code, e.read().decode(errors='replace').strip())
    except Exception as e:
        out[name] = 'error: %s: %s' % (type(e).__name__, e)
get = lambda url, **kw: urllib.request.urlopen(url, timeout=10, **kw).read().decode()
attempt('http', lambda: get('http://%s/pkg' % http_addr))
attempt('https', lambda: get('https://%s/secure' % tls_addr, context=ssl._create_unverified_context()))
attempt('unlisted', lambda: get('http://%s/' % other_addr))
# NO_PROXY keeps clients from proxying localhost; ask the proxy anyway: it must refuse
# the loopback address the name resolves to.
def via_proxy(url, host):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
    s.sendall(('GET %s HTTP/1.1\r\nHost: %s\r\n\r\n' % (url, host)).encode())
    return s.recv(1000).decode()
attempt('localhost_name', lambda: via_proxy('http://localhost:%s/' % local_port, 'localhost:%s' % local_port))
def direct():
    socket.create_connection(tuple([http_addr.split(':')[0], int(http_addr.split(':')[1])]), timeout=3); return 'connected'
attempt('direct_ip', direct)
attempt('direct_public', lambda: (socket.create_connection(('1.1.1.1', 80), timeout=3), 'connected')[1])
attempt('dns', lambda: str(socket.getaddrinfo('example.com', 80)))
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
    s.sendto(b'x', ('8.8.8.8', 53)); return s.recv(10).decode()
attempt('udp', udp)
def host_mismatch():
    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
    s.sendall(('CONNECT %s HTTP/1.1\r\nHost: evil.example\r\n\r\n' % tls_addr).encode())
    return s.recv(200).decode().split('\r\n')[0]
attempt('host_mismatch', host_mismatch)
print(json.dumps(out))
`

// testEgress runs Egress on the suite's provider, whose Capabilities say it serves an
// egress allowlist.
func (s *suite) testEgress(t *testing.T) {
	cfg := s.opts.Config
	Egress(t, s.p, cfg, func(cfg roche.Config) string { return s.create(t, cfg) })
}

// Egress checks an egress allowlist from inside a sandbox that p makes from base with
// create: allowed HTTP and HTTPS hosts (local servers on loopback addresses of their
// own) are reached through the proxy; an unlisted host gets 403; a name that resolves to
// loopback, a direct connection, DNS, UDP and a CONNECT whose host does not match all
// fail; and no connection reaches a server that is not allowed.
func Egress(t *testing.T, p roche.Provider, base roche.Config, create func(roche.Config) string) {
	allowed := localServer(t, "127.0.0.2", false)
	secure := localServer(t, "127.0.0.3", true)
	other := localServer(t, "127.0.0.4", false)
	local := localServer(t, "127.0.0.1", false)
	_, localPort, _ := net.SplitHostPort(local.Listener.Addr().String())

	cfg := base
	cfg.NetworkAllowlist = []string{allowed.Listener.Addr().String(), secure.Listener.Addr().String(), "localhost:" + localPort}
	id := create(cfg)
	res, err := p.Exec(context.Background(), id, roche.ExecRequest{Cmd: []string{"python3", "-c", egressProbe,
		allowed.Listener.Addr().String(), secure.Listener.Addr().String(), other.Listener.Addr().String(), localPort}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("probe: %+v %v", res, err)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
		t.Fatalf("probe printed %q: %v", res.Stdout, err)
	}
	for name, want := range map[string]string{
		"http":           "ok: hello from /pkg",
		"https":          "ok: hello from /secure",
		"unlisted":       "http 403",
		"localhost_name": "127.0.0.0/8, Loopback",
		"direct_ip":      "error:",
		"direct_public":  "error:",
		"dns":            "error: gaierror",
		"udp":            "error:",
		"host_mismatch":  "403",
	} {
		if !strings.Contains(got[name], want) {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	if n := other.conns.Load() + local.conns.Load(); n != 0 {
		t.Errorf("%d connections reached servers that are not allowed", n)
	}
	if allowed.conns.Load() == 0 || secure.conns.Load() == 0 {
		t.Errorf("allowed servers saw %d and %d connections", allowed.conns.Load(), secure.conns.Load())
	}
	egressLogged(t, id, allowed.Listener.Addr().String(), secure.Listener.Addr().String(), other.Listener.Addr().String(), localPort)
}

// egressLogged checks that the sandbox's proxy, which this process runs, logged every
// attempt that reached it, the refused ones too, with what it saw and why.
func egressLogged(t *testing.T, id, allowed, secure, other, localPort string) {
	t.Helper()
	px := egress.Lookup(id)
	if px == nil {
		t.Fatalf("no egress proxy registered under sandbox id %s", id)
	}
	var ds []egress.Decision
	testenv.Eventually(t, 10*time.Second, "the five decisions, the allowed ones ended", func() bool {
		ds, _ = px.Log(0)
		return len(ds) == 5 && ds[0].Done && ds[1].Done
	})
	want := []struct {
		method, target, rule, reason string
		allowed                      bool
	}{
		{"GET", allowed, allowed, "allowed by", true},
		{"CONNECT", secure, secure, "allowed by", true},
		{"GET", other, other, "not in this sandbox's allowlist", false},
		{"GET", "localhost:" + localPort, "", "Loopback", false},
		{"CONNECT", secure, "", "Host header", false},
	}
	for i, w := range want {
		d := ds[i]
		if d.Method != w.method || d.Target() != w.target || d.Rule != w.rule || d.Allowed != w.allowed ||
			!strings.Contains(d.Reason, w.reason) || d.Sandbox != id {
			t.Errorf("decision %d: %+v, want %+v", i, d, w)
		}
		if d.Allowed && (d.BytesIn == 0 || d.BytesOut == 0) {
			t.Errorf("decision %d relayed %d bytes out, %d in", i, d.BytesOut, d.BytesIn)
		}
	}
}
