package egress

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzParseRule parses any allowlist entry; one that parses is lower case, names a host
// (or an IP) without a wildcard, port or brackets left in it, prints back as an entry
// that parses to the same rule, and matches what it says: its host (any case, with a
// trailing dot) and for a wildcard the names below it but not the name itself, on its
// port or, without one, on the scheme's default port only.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"pypi.org", "*.npmjs.org", "example.com:8443", "127.0.0.2:8080", "[::1]:8443", "::1",
		"[::ffff:1.2.3.4]:80", "::ffff:169.254.169.254", "[fe80::1%eth0]:80", "localhost", "Example.COM.", "*.",
		"*.*.a.b", "a.b:0", "a.b:65536", "http://a.b/", "[a.b]", "[a.b]:80", " a.b ", "*.1.2.3.4", "a..b", "1.2.3.4:+80",
		"..", ".example.com", "*..com", "example..com:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		if r.Host == "" || r.Host != strings.ToLower(r.Host) || !r.IP.IsValid() && strings.ContainsAny(r.Host, "*[] /") ||
			(!r.IP.IsValid() && (strings.Contains(r.Host, ":") || slices.Contains(strings.Split(r.Host, "."), ""))) {
			t.Fatalf("%q parsed to host %q", s, r.Host)
		}
		if z := r.IP.Zone(); z != "" && (strings.ContainsAny(z, "*[]/ %:") || len(z) > 15) {
			t.Fatalf("%q parsed to zone %q, no interface's name", s, z)
		}
		if r.Port < 0 || r.Port > 65535 {
			t.Fatalf("%q parsed to port %d", s, r.Port)
		}
		again, err := ParseRule(r.String())
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("%q parsed to %+v, which prints as %q, which parses to %+v (%v)", s, r, r.String(), again, err)
		}
		p := Policy{Rules: []Rule{r}}
		for _, def := range []int{80, 443} {
			port := r.Port
			if port == 0 {
				port = def
			}
			host := r.Host
			if r.IP.IsValid() {
				host = r.IP.String()
			}
			name := host
			if r.Suffix {
				name = "sub." + host
				if _, ok := p.match(host, port, def); ok {
					t.Errorf("%q matches %s itself", s, host)
				}
			}
			for _, n := range []string{name, strings.ToUpper(name), name + "."} {
				if _, ok := p.match(n, port, def); !ok && !(r.IP.IsValid() && n != name) {
					t.Errorf("%q does not match %s:%d", s, n, port)
				}
			}
			if other := port%65535 + 1; r.Port != 0 || other != def {
				if _, ok := p.match(name, other, def); ok {
					t.Errorf("%q matches %s on port %d", s, name, other)
				}
			}
			if !r.IP.IsValid() {
				if _, ok := p.match("x"+host, port, def); ok && !r.Suffix {
					t.Errorf("%q matches x%s", s, host)
				}
			}
		}
	})
}

// FuzzRefusal asks the address checker about any address: an IPv4 address it refuses
// is refused in each IPv6 spelling that embeds it (mapped, NAT64, 6to4, compatible), a
// cloud metadata address is refused even to an entry naming it literally, and a zone
// changes nothing.
func FuzzRefusal(f *testing.F) {
	for _, s := range []string{"169.254.169.254", "10.1.2.3", "8.8.8.8", "127.0.0.1", "192.0.0.9", "255.255.255.255",
		"::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
		"fd00:ec2::254", "2606:4700::1111", "fe80::1", "64:ff9b:1:a9fe:a9:fe00::", "::a9fe:a9fe", "168.63.129.16"} {
		f.Add(netip.MustParseAddr(s).AsSlice(), "")
	}
	f.Add(netip.MustParseAddr("fe80::1").AsSlice(), "eth0")
	c := checker{hostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil }}
	f.Fuzz(func(t *testing.T, b []byte, zone string) {
		a, ok := netip.AddrFromSlice(b)
		if !ok {
			return
		}
		why := c.refusal(a, false)
		if c.refusal(a, false) != why {
			t.Fatalf("%s: two answers", a)
		}
		if a.Is6() && zone != "" && !strings.ContainsAny(zone, "%") {
			if z := c.refusal(a.WithZone(zone), false); (z == "") != (why == "") {
				t.Errorf("%s refused (%q), with zone %q (%q)", a, why, zone, z)
			}
		}
		meta := metadataRefusal(a)
		if lit := c.refusal(a, true); lit != meta {
			t.Errorf("%s named literally: refusal %q, the metadata check says %q", a, lit, meta)
		}
		if meta != "" && why == "" {
			t.Errorf("%s is a metadata address (%s) and is not refused", a, meta)
		}
		if !a.Is4() {
			return
		}
		v4 := a.As4()
		spellings := map[string]netip.Addr{
			"mapped":     netip.AddrFrom16([16]byte{10: 0xff, 11: 0xff, 12: v4[0], 13: v4[1], 14: v4[2], 15: v4[3]}),
			"NAT64":      netip.AddrFrom16([16]byte{0: 0, 1: 0x64, 2: 0xff, 3: 0x9b, 12: v4[0], 13: v4[1], 14: v4[2], 15: v4[3]}),
			"6to4":       netip.AddrFrom16([16]byte{0: 0x20, 1: 0x02, 2: v4[0], 3: v4[1], 4: v4[2], 5: v4[3], 15: 1}),
			"compatible": netip.AddrFrom16([16]byte{12: v4[0], 13: v4[1], 14: v4[2], 15: v4[3]}),
		}
		for name, six := range spellings {
			if why != "" && c.refusal(six, false) == "" {
				t.Errorf("%s is refused (%s) but its %s spelling %s is not", a, why, name, six)
			}
			if meta != "" && c.refusal(six, true) == "" {
				t.Errorf("%s is a metadata address but its %s spelling %s, named literally, is not refused", a, name, six)
			}
		}
	})
}

// fuzzResolver resolves every name to a public address, and names below
// private.wild.example to a private one, which the proxy must refuse.
type fuzzResolver struct{}

var (
	publicAddr  = netip.MustParseAddr("93.184.216.34")
	privateAddr = netip.MustParseAddr("10.1.1.1")
)

func (fuzzResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == "private.wild.example" || strings.HasSuffix(host, ".private.wild.example") {
		return []netip.Addr{publicAddr, privateAddr}, nil
	}
	return []netip.Addr{publicAddr}, nil
}

var fuzzPolicy = []string{"allowed.example", "*.wild.example", "10.0.0.5:8080", "[2001:db8::1]:443", "allowed.example:8443"}

// allowedByHand is the policy above decided without the proxy's code: the host (lower
// case, without a trailing dot or brackets) and port a request may reach.
func allowedByHand(host string, port int, connect bool) bool {
	def := 80
	if connect {
		def = 443
	}
	switch {
	case host == "allowed.example":
		return port == def || port == 8443
	case strings.HasSuffix(host, ".wild.example"):
		return port == def
	case host == "10.0.0.5":
		return port == 8080
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Unmap() == netip.MustParseAddr("2001:db8::1") {
		return port == 443
	}
	return false
}

// hostPort splits a request target as a client means it: host (lower case, no trailing
// dot, no brackets) and port (the scheme's default without one).
func hostPort(authority string, def int) (string, int, bool) {
	host, ps, err := net.SplitHostPort(authority)
	port := def
	if err != nil {
		host = authority
	} else if port, err = strconv.Atoi(ps); err != nil {
		return "", 0, false
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	return host, port, true
}

// FuzzProxyRequest sends the proxy any request bytes and watches what it dials. A dial
// happens only for a target the policy allows (decided here by hand, from the request
// as Go's own parser reads it), to the address the resolver gave (never a private one
// for a name), with no Host header naming anything else; and a plain request reaches
// the upstream with the Host it was allowed for.
func FuzzProxyRequest(f *testing.F) {
	for _, s := range []string{
		"GET http://allowed.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n",
		"CONNECT allowed.example:443 HTTP/1.1\r\nHost: allowed.example:443\r\n\r\nTLS bytes",
		"CONNECT a.wild.example:443 HTTP/1.1\r\n\r\n",
		"CONNECT private.wild.example:443 HTTP/1.1\r\n\r\n",
		"GET http://10.0.0.5:8080/x HTTP/1.1\r\nHost: 10.0.0.5:8080\r\n\r\n",
		"CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n",
		"GET http://allowed.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n",
		"GET http://allowed.example/ HTTP/1.1\nHost: evil.example\n\n",
		"GET http://allowed.example/ HTTP/1.1\nHost: evil.example\r\n\r\n",
		"GET http://allowed.example/ HTTP/1.1\r\nHost: allowed.example\r\nHost: evil.example\r\n\r\n",
		"GET http://allowed.example/ HTTP/1.1\r\nhost : evil.example\r\n\r\n",
		"GET http://ALLOWED.example./ HTTP/1.1\r\n\r\n",
		"CONNECT allowed.example:80 HTTP/1.1\r\n\r\n",
		"GET /relative HTTP/1.1\r\nHost: allowed.example\r\n\r\n",
		"GET https://allowed.example/ HTTP/1.1\r\n\r\n",
		"CONNECT evil.example:443 HTTP/1.1\r\n\r\n",
		"POST http://allowed.example/ HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, req []byte) {
		var mu sync.Mutex
		var dialed []string
		var upstreamHosts []string
		var upstreams sync.WaitGroup
		p := New(Options{
			Policy:    mustPolicy(t, fuzzPolicy),
			Resolver:  fuzzResolver{},
			HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil },
			Dial: func(_ context.Context, _, addr string) (net.Conn, error) {
				mu.Lock()
				dialed = append(dialed, addr)
				mu.Unlock()
				proxySide, upstream := net.Pipe()
				upstreams.Add(1)
				go func() {
					defer upstreams.Done()
					defer upstream.Close()
					br := bufio.NewReader(upstream)
					if r, err := http.ReadRequest(br); err == nil {
						// The whole request before the answer: the pipe holds nothing.
						_, _ = io.Copy(io.Discard, r.Body)
						mu.Lock()
						upstreamHosts = append(upstreamHosts, r.Host)
						mu.Unlock()
						_, _ = io.WriteString(upstream, "HTTP/1.1 204 No Content\r\n\r\n")
					}
					_, _ = io.Copy(io.Discard, br)
				}()
				return proxySide, nil
			},
		})
		client, proxySide := net.Pipe()
		served := make(chan struct{})
		go func() {
			p.ServeConn(proxySide)
			close(served)
		}()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_, _ = client.Write(req)
		client.Close()
		select {
		case <-served:
		case <-time.After(20 * time.Second):
			t.Fatal("the proxy did not finish a request whose client hung up")
		}
		p.Close()
		upstreams.Wait()
		if len(dialed) == 0 {
			return
		}
		if len(dialed) > 1 {
			t.Fatalf("one request dialled %d times: %v", len(dialed), dialed)
		}
		// What Go's parser reads from the same bytes: the target, and every Host header.
		br := bufio.NewReader(bytes.NewReader(req))
		tp := textproto.NewReader(br)
		line, err := tp.ReadLine()
		if err != nil {
			t.Fatalf("dialled %s for a request without a request line", dialed[0])
		}
		hdr, _ := tp.ReadMIMEHeader()
		method, rest, _ := strings.Cut(line, " ")
		uri, _, _ := strings.Cut(rest, " ")
		connect := method == http.MethodConnect
		authority := uri
		if !connect {
			r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(req)))
			if err != nil {
				t.Fatalf("dialled %s for a request Go does not parse: %v", dialed[0], err)
			}
			authority = r.URL.Host
		}
		def := 80
		if connect {
			def = 443
		}
		host, port, ok := hostPort(authority, def)
		if !ok || !allowedByHand(host, port, connect) {
			t.Fatalf("dialled %s for %s %q, which the policy does not allow", dialed[0], method, authority)
		}
		for _, h := range hdr.Values("Host") {
			if strings.TrimSpace(h) == "" {
				continue // names nothing: the target is the request line's (RFC 9112, 3.2.2)
			}
			hh, hp, ok := hostPort(strings.TrimSpace(h), def)
			if !ok || hh != host || hp != port {
				t.Fatalf("dialled %s for %q with a Host header naming %q", dialed[0], authority, h)
			}
		}
		dialHost, dialPort, _ := net.SplitHostPort(dialed[0])
		if dialPort != strconv.Itoa(port) {
			t.Fatalf("dialled %s for port %d", dialed[0], port)
		}
		if a := netip.MustParseAddr(dialHost); a == privateAddr || a.IsPrivate() && host != "10.0.0.5" {
			t.Fatalf("dialled %s for %q: a private address reached by name", dialed[0], host)
		}
		if !connect {
			if len(upstreamHosts) != 1 {
				t.Fatalf("the upstream got %d requests", len(upstreamHosts))
			}
			if uh, up, _ := hostPort(upstreamHosts[0], def); uh != host || up != port {
				t.Fatalf("the upstream was asked for Host %q; the request was allowed for %s:%d", upstreamHosts[0], host, port)
			}
		}
	})
}

func mustPolicy(t *testing.T, entries []string) Policy {
	p, err := ParsePolicy(entries)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
