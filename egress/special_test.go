package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// These tests drive the real proxy over loopback. Names resolve through a fake resolver,
// and the proxy's dialer is replaced: refused targets must never reach it, and allowed
// ones are connected to a listener on 127.0.0.1, so nothing leaves the host.

// upstream is the 127.0.0.1 server that every allowed dial is sent to, with the addresses
// the proxy asked for.
type upstream struct {
	url    *url.URL
	mu     sync.Mutex
	dialed []string
}

func newUpstream(t *testing.T) *upstream {
	s := newServer(t, "127.0.0.1", false)
	u, _ := url.Parse(s.URL)
	return &upstream{url: u}
}

func (u *upstream) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	u.mu.Lock()
	u.dialed = append(u.dialed, addr)
	u.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, "tcp", u.url.Host)
}

func (u *upstream) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	d := u.dialed
	u.dialed = nil
	return d
}

// ask sends one CONNECT or plain GET for host through the proxy and returns the status
// and body; an allowed CONNECT sends a GET through the tunnel and returns its answer.
func ask(t *testing.T, proxy *url.URL, method, host string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", proxy.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	authority := host
	if strings.Contains(host, ":") {
		authority = "[" + host + "]"
	}
	br := bufio.NewReader(c)
	if method == http.MethodConnect {
		fmt.Fprintf(c, "CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", authority, authority)
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("CONNECT %s: %v", host, err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		fmt.Fprintf(c, "GET /tunnel HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", authority)
	} else {
		fmt.Fprintf(c, "GET http://%s/plain HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, host, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// midAddr is the address half way through p.
func midAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	if p.Bits() < len(b)*8 {
		b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// withLow32 puts v4 in the last 32 bits of a.
func withLow32(a netip.Addr, v4 string) netip.Addr {
	b := a.As16()
	v := netip.MustParseAddr(v4).As4()
	copy(b[12:], v[:])
	return netip.AddrFrom16(b)
}

// mostSpecific is the test's own longest-prefix match over the table.
func mostSpecific(a netip.Addr) (block, bool) {
	var best block
	ok := false
	for _, b := range blocks {
		if b.prefix.Contains(a) && (!ok || b.prefix.Bits() > best.prefix.Bits()) {
			best, ok = b, true
		}
	}
	return best, ok
}

func noHostAddrs() ([]netip.Addr, error) { return nil, nil }

// stableHostAddrs lists this host's addresses but those of interfaces that other tests
// on the machine may be adding and removing (Docker networks, veth pairs).
func stableHostAddrs() ([]netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, "br-") || strings.HasPrefix(i.Name, "veth") || strings.HasPrefix(i.Name, "rt") || strings.HasPrefix(i.Name, "roche") {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				ip, _ := netip.AddrFromSlice(n.IP)
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// refusingDialer fails the test's expectations if the proxy dials at all.
type refusingDialer struct{ n atomic.Int64 }

func (d *refusingDialer) dial(context.Context, string, string) (net.Conn, error) {
	d.n.Add(1)
	return nil, errors.New("test dialer: refused targets must not be dialled")
}

func TestEgressEveryBlockRefused(t *testing.T) {
	type sample struct {
		addr netip.Addr
		want []string // substrings of the refusal
	}
	var samples []sample
	for _, b := range blocks {
		first, last, mid := b.prefix.Masked().Addr(), lastAddr(b.prefix), midAddr(b.prefix)
		if b.reachable {
			// The middle of a block that only spells IPv4 addresses embeds a public one;
			// take an inside address that embeds a private one instead.
			mid = withLow32(mid, "10.1.2.3")
			if b.prefix == pfx("2002::/16") {
				mid = netip.MustParseAddr("2002:a01:203::1")
			}
		}
		for _, a := range []netip.Addr{first, last, mid} {
			deep, _ := mostSpecific(a)
			want := []string{deep.prefix.String()}
			if deep.reachable {
				v4, _ := mostSpecific(deep.embeds(a)[0])
				want = append(want, "embeds", v4.prefix.String())
			}
			samples = append(samples, sample{a, want})
		}
	}
	for _, m := range metadataAddrs {
		samples = append(samples, sample{m.addr, []string{"cloud metadata", m.name}})
	}
	res := fakeResolver{}
	for i, s := range samples {
		res[fmt.Sprintf("s%d.example", i)] = []netip.Addr{s.addr}
	}
	var d refusingDialer
	_, proxy := startProxy(t, Options{Resolver: res, Dial: d.dial, HostAddrs: noHostAddrs}, "*.example")
	for i, s := range samples {
		name := fmt.Sprintf("s%d.example", i)
		for _, method := range []string{http.MethodConnect, http.MethodGet} {
			code, body := ask(t, proxy, method, name)
			if code != http.StatusForbidden {
				t.Errorf("%s %s -> %s: %d %q, want 403", method, name, s.addr, code, body)
				continue
			}
			for _, w := range s.want {
				if !strings.Contains(body, w) {
					t.Errorf("%s %s -> %s: %q does not name %q", method, name, s.addr, body, w)
				}
			}
		}
	}
	if n := d.n.Load(); n != 0 {
		t.Fatalf("the proxy dialled %d refused targets", n)
	}
	t.Logf("%d blocks, %d addresses refused through CONNECT and plain HTTP", len(blocks), len(samples))
}

// TestEgressTableIsTheRegistries guards the table against an edit that drops an entry:
// the registries have 26 IPv4 and 25 IPv6 rows (192.0.0.170 and .171 share one row).
func TestEgressTableIsTheRegistries(t *testing.T) {
	if len(ipv4Special) != 26 || len(ipv6Special) != 25 {
		t.Fatalf("table has %d IPv4 and %d IPv6 special-purpose entries, want 26 and 25", len(ipv4Special), len(ipv6Special))
	}
	for _, p := range []string{"192.0.0.0/24", "240.0.0.0/4", "100.64.0.0/10", "64:ff9b:1::/48", "2001::/32", "224.0.0.0/4", "ff00::/8"} {
		found := false
		for _, b := range blocks {
			found = found || b.prefix == pfx(p)
		}
		if !found {
			t.Errorf("%s is missing", p)
		}
	}
}

func TestEgressEmbeddedIPv4Refused(t *testing.T) {
	refusedV4 := []string{"169.254.169.254", "192.0.0.192", "100.100.100.200", "10.1.2.3", "127.0.0.1", "172.16.5.4", "192.168.1.1", "240.1.2.3", "198.18.0.1", "100.64.1.1", "255.255.255.255"}
	forms := map[string]func(v4 [4]byte) string{
		"IPv4-mapped":     func(v [4]byte) string { return fmt.Sprintf("::ffff:%d.%d.%d.%d", v[0], v[1], v[2], v[3]) },
		"IPv4-compatible": func(v [4]byte) string { return fmt.Sprintf("::%d.%d.%d.%d", v[0], v[1], v[2], v[3]) },
		"IPv4-translated": func(v [4]byte) string { return fmt.Sprintf("::ffff:0:%d.%d.%d.%d", v[0], v[1], v[2], v[3]) },
		"NAT64":           func(v [4]byte) string { return fmt.Sprintf("64:ff9b::%d.%d.%d.%d", v[0], v[1], v[2], v[3]) },
		"local NAT64 /96": func(v [4]byte) string { return fmt.Sprintf("64:ff9b:1::%d.%d.%d.%d", v[0], v[1], v[2], v[3]) },
		"local NAT64 /48": func(v [4]byte) string { return fmt.Sprintf("64:ff9b:1:%02x%02x:%02x:%02x00::", v[0], v[1], v[2], v[3]) },
		"6to4":            func(v [4]byte) string { return fmt.Sprintf("2002:%02x%02x:%02x%02x::1", v[0], v[1], v[2], v[3]) },
		"Teredo server":   func(v [4]byte) string { return fmt.Sprintf("2001:0:%02x%02x:%02x%02x::1", v[0], v[1], v[2], v[3]) },
		"Teredo client": func(v [4]byte) string {
			return fmt.Sprintf("2001:0:808:808:0:0:%02x%02x:%02x%02x", ^v[0], ^v[1], ^v[2], ^v[3])
		},
		"6to4, subnet ffff": func(v [4]byte) string { return fmt.Sprintf("2002:%02x%02x:%02x%02x:ffff::", v[0], v[1], v[2], v[3]) },
	}
	res := fakeResolver{}
	want := map[string]string{}
	i := 0
	for _, v4 := range refusedV4 {
		for form, spell := range forms {
			a := netip.MustParseAddr(spell(netip.MustParseAddr(v4).As4()))
			name := fmt.Sprintf("e%d.example", i)
			i++
			res[name] = []netip.Addr{a}
			want[name] = form + " " + a.String() + " must name " + v4
		}
	}
	var d refusingDialer
	_, proxy := startProxy(t, Options{Resolver: res, Dial: d.dial, HostAddrs: noHostAddrs}, "*.example")
	for name, w := range want {
		v4 := w[strings.LastIndex(w, " ")+1:]
		for _, method := range []string{http.MethodConnect, http.MethodGet} {
			code, body := ask(t, proxy, method, name)
			if code != http.StatusForbidden || !strings.Contains(body, "embeds the IPv4 address "+v4) {
				t.Errorf("%s: %s: %d %q", w, method, code, body)
			}
		}
	}
	if n := d.n.Load(); n != 0 {
		t.Fatalf("the proxy dialled %d refused targets", n)
	}

	// Forms refused whole, whatever they embed.
	whole := map[string]string{
		"64:ff9b:1::808:808":          "64:ff9b:1::/48",
		"2001:0:808:808::f7f7:f7f7":   "2001::/32",
		"::8.8.8.8":                   "::/96",
		"::ffff:0:8.8.8.8":            "::ffff:0:0:0/96",
		"2001:0:4136:e378::f7f7:f7f7": "2001::/32",
	}
	res = fakeResolver{}
	for a := range whole {
		res["w"+strings.ReplaceAll(a, ":", "-")+".example"] = []netip.Addr{netip.MustParseAddr(a)}
	}
	_, proxy = startProxy(t, Options{Resolver: res, Dial: d.dial, HostAddrs: noHostAddrs}, "*.example")
	for a, block := range whole {
		code, body := ask(t, proxy, http.MethodGet, "w"+strings.ReplaceAll(a, ":", "-")+".example")
		if code != http.StatusForbidden || !strings.Contains(body, block) {
			t.Errorf("%s: %d %q, want 403 naming %s", a, code, body, block)
		}
	}
	if n := d.n.Load(); n != 0 {
		t.Fatalf("the proxy dialled %d refused targets", n)
	}
}

func TestEgressPublicAddressesAllowed(t *testing.T) {
	up := newUpstream(t)
	allowed := map[string]string{ // address -> what the proxy must dial
		"93.184.216.34":          "93.184.216.34:443",
		"8.8.8.8":                "8.8.8.8:443",
		"2606:4700:4700::1111":   "[2606:4700:4700::1111]:443",
		"::ffff:8.8.4.4":         "8.8.4.4:443",
		"64:ff9b::808:808":       "[64:ff9b::808:808]:443",
		"2002:808:808::1":        "[2002:808:808::1]:443",
		"2a00:1450:4001:80b::e":  "[2a00:1450:4001:80b::e]:443",
		"1.0.0.1":                "1.0.0.1:443",
		"223.255.255.254":        "223.255.255.254:443",
		"2c0f:ffff:ffff:ffff::1": "[2c0f:ffff:ffff:ffff::1]:443",
	}
	res := fakeResolver{}
	for a := range allowed {
		res["p"+strings.NewReplacer(":", "-", ".", "-").Replace(a)+".example"] = []netip.Addr{netip.MustParseAddr(a)}
	}
	_, proxy := startProxy(t, Options{Resolver: res, Dial: up.dial, HostAddrs: noHostAddrs}, "*.example")
	for a, dial := range allowed {
		name := "p" + strings.NewReplacer(":", "-", ".", "-").Replace(a) + ".example"
		for _, method := range []string{http.MethodConnect, http.MethodGet} {
			code, body := ask(t, proxy, method, name)
			if code != http.StatusOK || !strings.Contains(body, "hello from") {
				t.Errorf("%s %s (%s): %d %q, want 200", method, name, a, code, body)
				continue
			}
			want := dial
			if method == http.MethodGet {
				want = strings.TrimSuffix(dial, ":443") + ":80"
			}
			if got := up.take(); len(got) != 1 || got[0] != want {
				t.Errorf("%s %s: dialled %v, want %s", method, name, got, want)
			}
		}
	}
}

func TestEgressHostAddressesRefused(t *testing.T) {
	// A public address the host holds (as on a cloud instance with a public IP).
	own := []netip.Addr{netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("2606:4700:4700::1111")}
	var d refusingDialer
	res := fakeResolver{
		"v4.example": {own[0]}, "v6.example": {own[1]},
		"mapped.example": {netip.MustParseAddr("::ffff:93.184.216.34")},
		"nat64.example":  {netip.MustParseAddr("64:ff9b::5db8:d822")},
		"mixed.example":  {netip.MustParseAddr("8.8.8.8"), own[0]},
	}
	_, proxy := startProxy(t, Options{Resolver: res, Dial: d.dial, HostAddrs: func() ([]netip.Addr, error) { return own, nil }}, "*.example")
	for name := range res {
		code, body := ask(t, proxy, http.MethodGet, name)
		if code != http.StatusForbidden || !strings.Contains(body, "an address of this host") {
			t.Errorf("%s: %d %q, want 403 naming a host address", name, code, body)
		}
	}

	// Failing to list the host's addresses refuses rather than guessing.
	_, proxy = startProxy(t, Options{Resolver: res, Dial: d.dial, HostAddrs: func() ([]netip.Addr, error) { return nil, errors.New("netlink unavailable") }}, "*.example")
	if code, body := ask(t, proxy, http.MethodGet, "mixed.example"); code != http.StatusForbidden || !strings.Contains(body, "netlink unavailable") {
		t.Errorf("unlistable host addresses: %d %q, want 403", code, body)
	}

	// The real list: every address on this host's interfaces, through the default reader.
	real, err := stableHostAddrs()
	if err != nil || len(real) == 0 {
		t.Fatalf("listing this host's addresses: %v %v", real, err)
	}
	res = fakeResolver{}
	for i, a := range real {
		res[fmt.Sprintf("h%d.example", i)] = []netip.Addr{a}
	}
	_, proxy = startProxy(t, Options{Resolver: res, Dial: d.dial}, "*.example")
	for i, a := range real {
		code, body := ask(t, proxy, http.MethodConnect, fmt.Sprintf("h%d.example", i))
		if code != http.StatusForbidden || !strings.Contains(body, a.String()+" is an address of this host (interface ") {
			t.Errorf("host address %s: %d %q, want 403 naming it and its interface", a, code, body)
		}
	}
	if n := d.n.Load(); n != 0 {
		t.Fatalf("the proxy dialled %d refused targets", n)
	}
}

func TestEgressLiteralEntries(t *testing.T) {
	up := newUpstream(t)
	own := netip.MustParseAddr("93.184.216.34")
	_, proxy := startProxy(t, Options{Dial: up.dial, HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{own}, nil }},
		"169.254.169.254", "[fd00:ec2::254]", "[::ffff:169.254.169.254]", "[64:ff9b::a9fe:a9fe]", "168.63.129.16", "100.100.100.200", "192.0.0.192",
		"10.1.2.3", "93.184.216.34", "[fd00::1]")
	for _, host := range []string{"169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "168.63.129.16", "100.100.100.200", "192.0.0.192"} {
		code, body := ask(t, proxy, http.MethodGet, host)
		if code != http.StatusForbidden || !strings.Contains(body, "cloud metadata") {
			t.Errorf("literal entry %s: %d %q, want 403: no entry opens a metadata address", host, code, body)
		}
	}
	if got := up.take(); len(got) != 0 {
		t.Fatalf("metadata addresses dialled: %v", got)
	}
	// A literal entry still opens exactly its private or host address (a mirror on the
	// LAN or on the host).
	for _, host := range []string{"10.1.2.3", "93.184.216.34", "fd00::1"} {
		code, body := ask(t, proxy, http.MethodGet, host)
		if code != http.StatusOK {
			t.Errorf("literal entry %s: %d %q, want 200", host, code, body)
		}
	}
	if got := up.take(); len(got) != 3 {
		t.Fatalf("dialled %v, want the three literal entries", got)
	}
}

// fakeClock is the rate limits' clock.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) add(d time.Duration) { c.ns.Add(int64(d)) }

// records keeps log records.
type records struct {
	mu  sync.Mutex
	got []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.got = append(r.got, rec)
	r.mu.Unlock()
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) take() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.got
	r.got = nil
	return g
}

func attr(rec slog.Record, key string) string {
	v := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

func TestEgressRefusalLogsRateLimited(t *testing.T) {
	clock := &fakeClock{}
	clock.add(time.Hour)
	logs := &records{}
	var d refusingDialer
	res := fakeResolver{"meta.example": {netip.MustParseAddr("169.254.169.254")}}
	p, proxy := startProxy(t, Options{Resolver: res, Dial: d.dial, HostAddrs: noHostAddrs, Log: slog.New(logs), now: clock.now}, "*.example")

	for range 100 {
		if code, _ := ask(t, proxy, http.MethodGet, "meta.example"); code != http.StatusForbidden {
			t.Fatalf("refusal %d", code)
		}
	}
	if got := logs.take(); len(got) != refusedLogBurst {
		t.Fatalf("100 refusals in an instant wrote %d lines, want the burst of %d", len(got), refusedLogBurst)
	}
	clock.add(5 * refusedLogEvery)
	ask(t, proxy, http.MethodGet, "meta.example")
	if got := logs.take(); len(got) != 1 || attr(got[0], "suppressed") != "80" {
		t.Fatalf("first line after the pause: %d lines (%v), want 1 line saying suppressed=80", len(got), got)
	}
	for range 10 {
		ask(t, proxy, http.MethodGet, "meta.example")
	}
	if got := logs.take(); len(got) != 4 {
		t.Fatalf("10 more refusals with 4 tokens left wrote %d lines, want 4", len(got))
	}
	p.Close()
	if got := logs.take(); len(got) != 1 || attr(got[0], "refused") != "6" {
		t.Fatalf("Close: %d lines (%v), want one line counting refused=6", len(got), got)
	}
}

// BenchmarkEgressDecision measures one decision for a public address, reading this
// host's addresses from the kernel as the proxy does.
func BenchmarkEgressDecision(b *testing.B) {
	c := checker{hostAddrs: interfaceAddrs, hostName: interfaceName}
	a := netip.MustParseAddr("93.184.216.34")
	for b.Loop() {
		if why := c.refusal(a, false); why != "" {
			b.Fatal(why)
		}
	}
}
