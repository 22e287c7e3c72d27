package egress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// observed collects the final decisions of the proxy whose sandbox id is id.
func observed(t *testing.T, id string) <-chan Decision {
	ch := make(chan Decision, 100)
	stop := Observe(func(d Decision) {
		if d.Sandbox == id {
			ch <- d
		}
	})
	t.Cleanup(stop)
	return ch
}

func next(t *testing.T, ch <-chan Decision) Decision {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no decision observed in 10 s")
		return Decision{}
	}
}

// raw sends one raw proxy request and returns the status.
func raw(t *testing.T, proxy, req string) int {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestDecisionLogHasEveryAttempt: allowed and refused requests, the bypass attempts
// among them, are each logged once with what the proxy saw and did, bytes included.
func TestDecisionLogHasEveryAttempt(t *testing.T) {
	s := newServer(t, "127.0.0.2", false)
	other := newServer(t, "127.0.0.4", false)
	allowed := s.Listener.Addr().String()
	ch := observed(t, "sb-log")
	p, proxy := startProxy(t, Options{Sandbox: "sb-log"}, allowed)
	if Lookup("sb-log") != p {
		t.Fatal("Lookup does not find the proxy by its sandbox id")
	}

	code, body := get(t, client(proxy, nil), s.URL+"/pkg?x=1")
	if code != 200 {
		t.Fatalf("allowed: %d %q", code, body)
	}
	d := next(t, ch)
	if !d.Allowed || d.Method != "GET" || d.Path != "/pkg" || d.Host != "127.0.0.2" || d.Rule != allowed ||
		d.Addr != "127.0.0.2" || !d.Done || d.BytesIn < int64(len(body)) || d.BytesOut == 0 || d.Sandbox != "sb-log" {
		t.Fatalf("allowed request logged as %+v", d)
	}

	// Refused: not listed (its rule suggested), the Host header naming another host,
	// CONNECT to an unlisted IP, garbage.
	if code, _ := get(t, client(proxy, nil), other.URL+"/x"); code != 403 {
		t.Fatalf("unlisted: %d", code)
	}
	if code := raw(t, proxy.Host, "CONNECT "+allowed+" HTTP/1.1\r\nHost: "+other.Listener.Addr().String()+"\r\n\r\n"); code != 403 {
		t.Fatalf("Host mismatch: %d", code)
	}
	if code := raw(t, proxy.Host, "CONNECT 127.0.0.9:443 HTTP/1.1\r\n\r\n"); code != 403 {
		t.Fatalf("CONNECT to an IP: %d", code)
	}
	if code := raw(t, proxy.Host, "NONSENSE\r\n\r\n"); code != 400 {
		t.Fatalf("garbage: %d", code)
	}
	want := []struct{ method, host, rule, reason string }{
		{"GET", "127.0.0.4", other.Listener.Addr().String(), "not in this sandbox's allowlist"},
		{"CONNECT", "127.0.0.2", "", "Host header"},
		{"CONNECT", "127.0.0.9", "127.0.0.9", "not in this sandbox's allowlist"},
		{"", "", "", "malformed"},
	}
	for _, w := range want {
		d := next(t, ch)
		if d.Allowed || d.Method != w.method || d.Host != w.host || d.Rule != w.rule || !strings.Contains(d.Reason, w.reason) {
			t.Fatalf("refusal logged as %+v, want %+v", d, w)
		}
	}
	if other.conns.Load() != 0 {
		t.Fatal("a refused request reached its server")
	}
	all, dropped := p.Log(0)
	if len(all) != 5 || dropped != 0 || all[0].Seq != 1 || all[4].Seq != 5 {
		t.Fatalf("log holds %d decisions (%d dropped): %+v", len(all), dropped, all)
	}
	if later, _ := p.Log(3); len(later) != 2 || later[0].Seq != 4 {
		t.Fatalf("Log(3): %+v", later)
	}
	if got := Suggest(all); !slices.Equal(got, []string{other.Listener.Addr().String(), "127.0.0.9"}) {
		t.Fatalf("Suggest: %q", got)
	}
	p.Close()
	if Lookup("sb-log") != nil {
		t.Fatal("a closed proxy is still found")
	}
}

// TestDecisionLogBounded: past LogSize the oldest are dropped and counted.
func TestDecisionLogBounded(t *testing.T) {
	p, proxy := startProxy(t, Options{LogSize: 3}, "127.0.0.2:1")
	for i := range 5 {
		if code := raw(t, proxy.Host, fmt.Sprintf("CONNECT 127.0.0.%d:443 HTTP/1.1\r\n\r\n", 10+i)); code != 403 {
			t.Fatalf("CONNECT %d: %d", i, code)
		}
	}
	all, dropped := p.Log(0)
	if len(all) != 3 || dropped != 2 || all[0].Host != "127.0.0.12" || all[2].Seq != 5 {
		t.Fatalf("bounded log: %d dropped, %+v", dropped, all)
	}
}

// TestLivePolicy: a rule added lets the next connection through, one removed refuses it.
func TestLivePolicy(t *testing.T) {
	s := newServer(t, "127.0.0.2", false)
	p, proxy := startProxy(t, Options{}, "127.0.0.3:1")
	c := client(proxy, nil)
	if code, _ := get(t, c, s.URL); code != 403 {
		t.Fatalf("before Allow: %d", code)
	}
	r, err := ParseRule(s.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p.Allow(r, r)
	if n := len(p.Policy().Rules); n != 2 {
		t.Fatalf("after Allow twice: %d rules", n)
	}
	if code, _ := get(t, c, s.URL); code != 200 {
		t.Fatalf("after Allow: %d", code)
	}
	if missing := p.Remove(r); len(missing) != 0 {
		t.Fatalf("Remove: %v missing", missing)
	}
	if code, _ := get(t, c, s.URL); code != 403 {
		t.Fatalf("after Remove: %d", code)
	}
	if missing := p.Remove(r); len(missing) != 1 {
		t.Fatal("removing an absent rule is not reported")
	}
}

// rebinder answers a name with a public address first and a loopback one after, as a
// DNS-rebinding server would, counting lookups.
type rebinder struct{ n atomic.Int64 }

func (r *rebinder) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	if r.n.Add(1) == 1 {
		return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
	}
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// TestDNSRebindingDialsTheAddressChecked: the proxy resolves once and dials the address
// it checked, so a name that answers differently a moment later cannot send it to
// loopback; the log names the address dialled. A name answering loopback from the
// start is refused and logged.
func TestDNSRebindingDialsTheAddressChecked(t *testing.T) {
	up := newUpstream(t)
	res := &rebinder{}
	p, proxy := startProxy(t, Options{Resolver: res, Dial: up.dial, HostAddrs: noHostAddrs}, "rebind.example")
	if code, body := ask(t, proxy, http.MethodConnect, "rebind.example"); code != 200 {
		t.Fatalf("first CONNECT: %d %q", code, body)
	}
	if got := up.take(); !slices.Equal(got, []string{"93.184.216.34:443"}) || res.n.Load() != 1 {
		t.Fatalf("dialled %v after %d lookups, want only the address checked after one", got, res.n.Load())
	}
	// The second answer is loopback: refused, nothing dialled.
	if code, body := ask(t, proxy, http.MethodConnect, "rebind.example"); code != 403 || !strings.Contains(body, "Loopback") {
		t.Fatalf("CONNECT once the name rebinds to loopback: %d %q", code, body)
	}
	if got := up.take(); len(got) != 0 {
		t.Fatalf("dialled %v for a name resolving to loopback", got)
	}
	ds, _ := p.Log(0)
	if len(ds) != 2 || ds[0].Addr != "93.184.216.34" || !ds[0].Allowed || ds[1].Addr != "127.0.0.1" || ds[1].Allowed || ds[1].Rule != "" {
		t.Fatalf("log: %+v", ds)
	}
}
