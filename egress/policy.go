// Package egress is the host side of Roche's egress allowlist: an HTTP proxy that lets a
// sandbox reach only the hosts it was given, by name. The sandbox itself has no network
// interface but lo; roche-agent forwards its HTTP_PROXY port over the control channel to
// this proxy, which resolves names itself, refuses every special-purpose address (the IANA
// registries in full, see special.go), cloud metadata addresses and the host's own
// addresses, caps bytes and connections, and logs its decisions (rate-limited). Nothing
// is enforced inside the sandbox, where untrusted code lives.
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Rule is one allowlist entry: an exact host, a "*." suffix, or an IP literal, with an
// optional port (without one, 80 for HTTP and 443 for CONNECT).
type Rule struct {
	Host   string // lower case, without the "*." of a wildcard
	Suffix bool   // "*.example.com": any name below example.com (not example.com itself)
	Port   int    // 0: the scheme's default port
	// IP is set when Host is an IP literal; only such a rule can allow a special-purpose
	// or host address (a mirror on the LAN or the host), never a cloud metadata address.
	IP netip.Addr
	// Intercept is set by an "https://" entry: the proxy terminates the TLS of a CONNECT
	// to the host with the sandbox's own CA, and allows only the requests inside whose
	// method is one of Methods (any when empty) and whose path starts with Path.
	Intercept bool
	Methods   []string // upper case
	Path      string   // a prefix starting with "/"; "/" allows every path
}

func (r Rule) String() string {
	if r.Intercept {
		s := "https://" + r.hostPort() + r.Path
		if len(r.Methods) > 0 {
			s = strings.Join(r.Methods, ",") + " " + s
		}
		return s
	}
	return r.hostPort()
}

func (r Rule) hostPort() string {
	h := r.Host
	if r.Suffix {
		h = "*." + h
	}
	if r.IP.IsValid() && strings.Contains(r.Host, ":") {
		// Any IPv6 spelling, the mapped form of an IPv4 address ("::ffff:1.2.3.4") too,
		// whose IP is the IPv4 address.
		h = "[" + h + "]"
	}
	if r.Port != 0 {
		h += ":" + strconv.Itoa(r.Port)
	}
	return h
}

// ParseRule parses "pypi.org", "*.npmjs.org", "example.com:8443", "127.0.0.2:8080" or
// "[::1]:8443".
//
// An entry "[METHOD[,METHOD...] ]https://HOST[:PORT][/PATH-PREFIX]" is intercepted: e.g.
// "https://api.example.com/v1/" or "GET,HEAD https://pypi.org/simple/". Its HOST[:PORT]
// is spelled as above; without methods any is allowed, without a path any path.
func ParseRule(s string) (Rule, error) {
	orig := s
	s = strings.TrimSpace(s)
	if s == "" {
		return Rule{}, errors.New("empty allowlist entry")
	}
	if i := strings.Index(strings.ToLower(s), "https://"); i >= 0 {
		return parseIntercept(orig, strings.TrimSpace(s[:i]), s[i+len("https://"):])
	}
	s = strings.ToLower(s)
	if strings.Contains(s, "/") {
		return Rule{}, fmt.Errorf("allowlist entry %q: give a host name (and port), not a URL (an https:// URL is intercepted: see --allow-host)", orig)
	}
	var r Rule
	host := s
	if h, p, err := net.SplitHostPort(s); err == nil {
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return Rule{}, fmt.Errorf("allowlist entry %q: port %q is not 1-65535", orig, p)
		}
		host, r.Port = h, port
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if z := ip.Zone(); z != "" && !zoneOK(z) {
			return Rule{}, fmt.Errorf("allowlist entry %q: zone %q is not an interface name such as eth0", orig, z)
		}
		r.Host, r.IP = ip.String(), ip.Unmap()
		return r, nil
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Suffix = true
		host = rest
	}
	host = strings.TrimSuffix(host, ".")
	if _, err := netip.ParseAddr(host); err == nil {
		// "1.2.3.4." would be a name the proxy then takes for the address, which only an
		// entry naming the address literally may allow ("*.1.2.3.4" names nothing).
		return Rule{}, fmt.Errorf("allowlist entry %q: give an IP address bare, without \"*.\" or a trailing dot", orig)
	}
	// An empty label ("..", ".example.com", "example..com") names no host.
	if host == "" || strings.ContainsAny(host, "*:[] ") || strings.Count(host, ".") == 0 && !r.Suffix && host != "localhost" ||
		slices.Contains(strings.Split(host, "."), "") {
		return Rule{}, fmt.Errorf("allowlist entry %q: use a host such as pypi.org, *.npmjs.org or example.com:8443", orig)
	}
	for _, c := range host {
		switch {
		case c >= utf8.RuneSelf:
			// Matched by lower case, which outside ASCII is no DNS rule; and looked up
			// as UTF-8, which no resolver takes.
			return Rule{}, fmt.Errorf("allowlist entry %q: give an internationalized name in its ASCII form (xn--...)", orig)
		case !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'):
			return Rule{}, fmt.Errorf("allowlist entry %q: a host name holds letters, digits, '-', '_' and dots only", orig)
		}
	}
	r.Host = host
	return r, nil
}

// parseIntercept parses the methods and the URL after "https://" of an intercepted entry.
func parseIntercept(orig, methods, rest string) (Rule, error) {
	hostPort, p, hasPath := strings.Cut(rest, "/")
	if strings.ContainsAny(hostPort, "@?#") || strings.ContainsAny(p, "?# \t") {
		return Rule{}, fmt.Errorf("allowlist entry %q: give https://HOST[:PORT][/PATH-PREFIX], without user, query or fragment", orig)
	}
	r, err := ParseRule(hostPort)
	if err != nil {
		return Rule{}, err
	}
	r.Intercept, r.Path = true, "/"
	if hasPath {
		r.Path = "/" + p
		if !cleanPath(r.Path) {
			return Rule{}, fmt.Errorf("allowlist entry %q: the path prefix holds an empty, \".\" or \"..\" segment or an escape", orig)
		}
	}
	if methods != "" {
		for _, m := range strings.Split(methods, ",") {
			m = strings.ToUpper(strings.TrimSpace(m))
			if m == "" || strings.Trim(m, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
				return Rule{}, fmt.Errorf("allowlist entry %q: give methods as GET,POST before the URL", orig)
			}
			if m == http.MethodConnect {
				return Rule{}, fmt.Errorf("allowlist entry %q: CONNECT is not a method inside an intercepted connection", orig)
			}
			if !slices.Contains(r.Methods, m) {
				r.Methods = append(r.Methods, m)
			}
		}
	}
	return r, nil
}

// cleanPath reports whether a request path (decoded) or a rule's prefix has no segment
// a server may read otherwise than its bytes: none empty (but the last), ".", "..", and
// no "%" escape or backslash left in it. A path prefix checked on such a path holds.
func cleanPath(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "%\\\x00") {
		return false
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		if s == "." || s == ".." || s == "" && i != len(segs)-1 {
			return false
		}
	}
	return true
}

// zoneOK reports whether an IPv6 zone is an interface name (at most 15 bytes of letters,
// digits, '.', '-' and '_', as Linux allows, not ending in '.', which a request's host
// loses as a name's trailing dot) or index: netip takes any string after '%'.
func zoneOK(z string) bool {
	if len(z) > 15 || strings.HasSuffix(z, ".") {
		return false
	}
	for _, c := range z {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Policy is a sandbox's allowlist.
type Policy struct {
	Rules []Rule
}

// ParsePolicy parses allowlist entries, reporting every bad one.
func ParsePolicy(entries []string) (Policy, error) {
	var p Policy
	var bad []string
	for _, e := range entries {
		r, err := ParseRule(e)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		p.Rules = append(p.Rules, r)
	}
	if len(bad) > 0 {
		return Policy{}, fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return p, nil
}

// match returns the host:port rule that allows host:port, if any: an intercepted rule
// allows a CONNECT (defaultPort 443) only, and is returned only when no plain rule
// allows host:port. defaultPort is the scheme's.
func (p Policy) match(host string, port, defaultPort int) (Rule, bool) {
	var found Rule
	ok := false
	for _, r := range p.matches(host, port, defaultPort) {
		if !r.Intercept {
			return r, true
		}
		if defaultPort == 443 && !ok {
			found, ok = r, true
		}
	}
	return found, ok
}

// intercepted reports whether a CONNECT to host:port has an intercepted rule.
func (p Policy) intercepted(host string, port int) bool {
	return slices.ContainsFunc(p.matches(host, port, 443), func(r Rule) bool { return r.Intercept })
}

// matchRequest returns the rule that allows a request inside an intercepted CONNECT to
// host:port: a plain rule for host:port allows any, an intercepted one its methods and
// path prefix.
func (p Policy) matchRequest(host string, port int, method, path string) (Rule, bool) {
	for _, r := range p.matches(host, port, 443) {
		if !r.Intercept {
			return r, true
		}
		if (len(r.Methods) == 0 || slices.Contains(r.Methods, method)) && strings.HasPrefix(path, r.Path) {
			return r, true
		}
	}
	return Rule{}, false
}

// matches returns the rules whose host and port allow host:port.
func (p Policy) matches(host string, port, defaultPort int) []Rule {
	var out []Rule
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	ip, ipErr := netip.ParseAddr(strings.Trim(host, "[]"))
	for _, r := range p.Rules {
		want := r.Port
		if want == 0 {
			want = defaultPort
		}
		if port != want {
			continue
		}
		switch {
		case r.IP.IsValid():
			if ipErr == nil && ip.Unmap() == r.IP {
				out = append(out, r)
			}
		case r.Suffix:
			if strings.HasSuffix(host, "."+r.Host) {
				out = append(out, r)
			}
		case host == r.Host:
			out = append(out, r)
		}
	}
	return out
}

// Intercepts reports whether any rule is intercepted (the sandbox then needs its CA).
func (p Policy) Intercepts() bool {
	return slices.ContainsFunc(p.Rules, func(r Rule) bool { return r.Intercept })
}
