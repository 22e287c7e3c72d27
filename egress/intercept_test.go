package egress

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/localca"
)

// tlsUp is an HTTPS server on a loopback address, with a certificate from a test CA
// the proxy is given as its roots, recording what reaches it.
type tlsUp struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
	auth []string
}

func newTLSUp(t *testing.T, ip string, ca *localca.CA) *tlsUp {
	t.Helper()
	u := &tlsUp{}
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.reqs = append(u.reqs, r)
		u.auth = append(u.auth, r.Header.Get("Authorization"))
		u.mu.Unlock()
		fmt.Fprintf(w, "upstream %s %s %s proto %d", r.Method, r.Host, r.URL.Path, r.ProtoMajor)
	}))
	u.Listener = ln
	u.EnableHTTP2 = true
	leaf, err := ca.Server([]string{ip}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	u.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	u.StartTLS()
	t.Cleanup(u.Close)
	return u
}

func (u *tlsUp) seen() ([]string, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auth...), len(u.reqs)
}

func pool(ca *localca.CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func do(t *testing.T, c *http.Client, method, u string, hdr http.Header) (int, string, int) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error(), 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.ProtoMajor
}

func TestInterceptMethodAndPath(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			testCA, _ := localca.New("upstream test CA", time.Hour)
			up := newTLSUp(t, "127.0.0.1", testCA)
			port := up.Listener.Addr().(*net.TCPAddr).Port
			p, c, _ := interceptSetupWith(t, h2, nil, testCA, fmt.Sprintf("GET,HEAD https://127.0.0.1:%d/v1/", port))
			code, body, proto := do(t, c, "GET", up.URL+"/v1/pkg", nil)
			wantProto := 1
			if h2 {
				wantProto = 2
			}
			if code != 200 || !strings.Contains(body, "upstream GET") || proto != wantProto {
				t.Fatalf("allowed GET: %d %q proto %d", code, body, proto)
			}
			// The proxy re-originates over HTTP/2 when the upstream offers it, whatever the
			// sandbox spoke.
			if !strings.Contains(body, "proto 2") {
				t.Fatalf("upstream saw %q, want HTTP/2", body)
			}
			_, before := up.seen()
			for _, c2 := range []struct{ method, path string }{{"POST", "/v1/pkg"}, {"GET", "/admin"}, {"GET", "/v1"}} {
				code, body, _ := do(t, c, c2.method, up.URL+c2.path, nil)
				if code != 403 || !strings.Contains(body, "roche egress: "+c2.method+" "+c2.path+" on 127.0.0.1") {
					t.Fatalf("%s %s: %d %q, want 403 naming it", c2.method, c2.path, code, body)
				}
			}
			// A path a server may read as another ("/v1/../admin") is refused, sent raw.
			req, _ := http.NewRequest("GET", up.URL+"/v1/x", nil)
			req.URL.Opaque = "/v1/%2e%2e/admin"
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 {
				t.Fatalf("dot-dot path: %d %q, want 400", resp.StatusCode, b)
			}
			if _, after := up.seen(); after != before {
				t.Fatalf("refused requests reached the upstream (%d, then %d)", before, after)
			}
			log, _ := p.Log(0)
			var refused int
			for _, d := range log {
				if d.Method != "CONNECT" && !d.Allowed {
					refused++
				}
			}
			if refused != 4 {
				t.Fatalf("the decision log has %d refused requests, want 4: %+v", refused, log)
			}
		})
	}
}

// interceptSetupWith is interceptSetup with a given upstream test CA.
func interceptSetupWith(t *testing.T, h2 bool, secrets []Secret, testCA *localca.CA, rules ...string) (*Proxy, *http.Client, *localca.CA) {
	t.Helper()
	sandboxCA, err := NewCA("t")
	if err != nil {
		t.Fatal(err)
	}
	p, proxy := startProxy(t, Options{CA: sandboxCA, Roots: pool(testCA), Secrets: secrets}, rules...)
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: pool(sandboxCA)}, ForceAttemptHTTP2: h2}
	t.Cleanup(tr.CloseIdleConnections)
	return p, &http.Client{Transport: tr}, sandboxCA
}

func TestInterceptVerifiesUpstream(t *testing.T) {
	other, err := localca.New("a CA the proxy does not trust", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	up := newTLSUp(t, "127.0.0.1", other)
	testCA, _ := localca.New("trusted", time.Hour)
	_, c, _ := interceptSetupWith(t, true, nil, testCA, "https://"+up.Listener.Addr().String()+"/")
	code, body, _ := do(t, c, "GET", up.URL+"/", nil)
	if code != 502 || !strings.Contains(body, "certificate") {
		t.Fatalf("upstream with an untrusted certificate: %d %q, want 502", code, body)
	}
	if _, n := up.seen(); n != 0 {
		t.Fatalf("the request reached an upstream the proxy could not verify")
	}
}

func TestSecretBrokered(t *testing.T) {
	testCA, _ := localca.New("upstream test CA", time.Hour)
	bound := newTLSUp(t, "127.0.0.1", testCA)
	unbound := newTLSUp(t, "127.0.0.2", testCA)
	const value = "s3cr3t-value-9f8e7d"
	ph := NewPlaceholder()
	hosts, err := ParseSecretHosts("TOKEN", []string{bound.Listener.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}
	sec := []Secret{{Name: "TOKEN", Value: value, Placeholder: ph, Hosts: hosts, Header: "Authorization"}}
	plain := newServer(t, "127.0.0.3", false)
	p, c, _ := interceptSetupWith(t, true, sec, testCA,
		bound.Listener.Addr().String(), "https://"+unbound.Listener.Addr().String()+"/", plain.Listener.Addr().String())

	code, body, _ := do(t, c, "GET", bound.URL+"/api", http.Header{"Authorization": {"Bearer " + ph}})
	if code != 200 {
		t.Fatalf("bound host: %d %q", code, body)
	}
	if auth, _ := bound.seen(); len(auth) != 1 || auth[0] != "Bearer "+value {
		t.Fatalf("the bound host got Authorization %q, want the secret's value", auth)
	}
	// Another header than the one it is bound to.
	code, body, _ = do(t, c, "GET", bound.URL+"/api", http.Header{"X-Token": {ph}})
	if code != 403 || !strings.Contains(body, "bound to header Authorization") {
		t.Fatalf("placeholder in another header: %d %q", code, body)
	}
	for _, u := range []string{unbound.URL + "/", plain.URL + "/"} {
		code, body, _ = do(t, c, "GET", u, http.Header{"Authorization": {"Bearer " + ph}})
		if code != 403 || !strings.Contains(body, "secret TOKEN was sent to") {
			t.Fatalf("placeholder to unbound %s: %d %q, want 403", u, code, body)
		}
	}
	if _, n := unbound.seen(); n != 0 {
		t.Fatal("the unbound host got the request carrying the placeholder")
	}
	// Rotation: the next request carries the new value.
	p.SetSecret("TOKEN", "rotated-value-1234")
	do(t, c, "GET", bound.URL+"/api", http.Header{"Authorization": {"Bearer " + ph}})
	if auth, _ := bound.seen(); len(auth) != 2 || auth[1] != "Bearer rotated-value-1234" {
		t.Fatalf("after rotation the bound host got %q", auth)
	}
	log, _ := p.Log(0)
	b, _ := json.Marshal(log)
	if strings.Contains(string(b), value) || strings.Contains(string(b), "rotated-value") || strings.Contains(string(b), ph) {
		t.Fatalf("the decision log holds the secret or its placeholder: %s", b)
	}
	var refusals int
	for _, d := range log {
		if !d.Allowed && strings.Contains(d.Reason, "secret TOKEN") {
			refusals++
		}
	}
	if refusals != 3 {
		t.Fatalf("%d refusals for the placeholder logged, want 3: %s", refusals, b)
	}
}

// connectRaw opens a CONNECT tunnel to target through the proxy and returns the conn.
func connectRaw(t *testing.T, proxy *url.URL, target string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %v %v", target, resp, err)
	}
	return c
}

func TestSNIDifferingFromConnectRefused(t *testing.T) {
	testCA, _ := localca.New("upstream test CA", time.Hour)
	up := newTLSUp(t, "127.0.0.1", testCA)
	for _, rule := range []string{up.Listener.Addr().String(), "https://" + up.Listener.Addr().String() + "/"} {
		p, proxy := startProxy(t, Options{CA: mustCA(t), Roots: pool(testCA)}, rule)
		c := connectRaw(t, proxy, up.Listener.Addr().String())
		tc := tls.Client(c, &tls.Config{ServerName: "other.example", InsecureSkipVerify: true})
		if err := tc.Handshake(); err == nil {
			t.Fatalf("%s: a TLS name other than the CONNECT's got through", rule)
		}
		c.Close()
		var found bool
		for i := 0; i < 100 && !found; i++ {
			log, _ := p.Log(0)
			for _, d := range log {
				found = found || !d.Allowed && strings.Contains(d.Reason, `TLS name "other.example" differs`)
			}
			if !found {
				time.Sleep(10 * time.Millisecond)
			}
		}
		if !found {
			t.Fatalf("%s: no refusal naming the TLS name in the log", rule)
		}
		if _, n := up.seen(); n != 0 {
			t.Fatalf("%s: a request reached the upstream", rule)
		}
	}
}

func mustCA(t *testing.T) *localca.CA {
	ca, err := NewCA("t")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestHTTP2ReuseForAnotherHostRefused(t *testing.T) {
	testCA, _ := localca.New("upstream test CA", time.Hour)
	a := newTLSUp(t, "127.0.0.1", testCA)
	b := newTLSUp(t, "127.0.0.2", testCA)
	_, c, _ := interceptSetupWith(t, true, nil, testCA, "https://"+a.Listener.Addr().String()+"/", "https://"+b.Listener.Addr().String()+"/")
	req, _ := http.NewRequest("GET", a.URL+"/", nil)
	req.Host = b.Listener.Addr().String() // :authority of b, on a's connection
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest || resp.ProtoMajor != 2 {
		t.Fatalf("request for b on a's connection: %d HTTP/%d %q", resp.StatusCode, resp.ProtoMajor, body)
	}
	if _, n := a.seen(); n != 0 {
		t.Fatal("the misdirected request reached a")
	}
}
