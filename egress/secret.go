package egress

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Secret is a credential the proxy brokers: the sandbox holds only Placeholder (in its
// environment), and the proxy puts Value in its place in the headers of the intercepted
// requests to Hosts, and nowhere else. A request carrying the placeholder to any other
// host is refused. Value is never logged.
type Secret struct {
	Name        string
	Value       string
	Placeholder string
	// Hosts are the host[:port] entries (443 without a port) the secret is bound to; a
	// CONNECT to one is intercepted.
	Hosts []Rule
	// Header, if set, is the only request header the value is put in.
	Header string
	// Stored: the value comes from roched's secret store, and follows its rotation.
	// Recorded with the sandbox (roche.Secret.FromStore), so that a proxy started again
	// for it, which has no value, is bound to the store again (StoredSecrets).
	Stored bool
}

// NewPlaceholder returns a random stand-in for a secret's value, which is what the
// sandbox sees.
func NewPlaceholder() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "roche-secret-" + hex.EncodeToString(b)
}

// ParseSecretHosts parses a secret's bound hosts, spelled as allowlist entries without a
// path ("api.example.com", "api.example.com:8443").
func ParseSecretHosts(name string, hosts []string) ([]Rule, error) {
	var out []Rule
	for _, h := range hosts {
		r, err := ParseRule(h)
		if err != nil {
			return nil, fmt.Errorf("secret %s: %v", name, err)
		}
		if r.Intercept {
			return nil, fmt.Errorf("secret %s: bind it to HOST[:PORT], not a URL (%q)", name, h)
		}
		out = append(out, r)
	}
	return out, nil
}

// bound reports whether s may go to host:port (a CONNECT's, port 443 by default).
func (s Secret) bound(host string, port int) bool {
	_, ok := Policy{Rules: s.Hosts}.match(host, port, 443)
	return ok
}

// secretBound reports whether some secret is bound to host:port: a CONNECT to it is then
// intercepted, so that the proxy can put the value in.
func (p *Proxy) secretBound(host string, port int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.secrets {
		if s.bound(host, port) {
			return true
		}
	}
	return false
}

// SetSecret replaces the value of the secret named name, from the next request on, and
// reports whether this proxy has it.
func (p *Proxy) SetSecret(name, value string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.secrets {
		if p.secrets[i].Name == name {
			// A copy: substitute reads the slice it took without the lock.
			ss := slices.Clone(p.secrets)
			ss[i].Value = value
			p.secrets = ss
			return true
		}
	}
	return false
}

// StoredSecrets are the names of this proxy's secrets whose values come from roched's
// secret store (Secret.Stored).
func (p *Proxy) StoredSecrets() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, s := range p.secrets {
		if s.Stored {
			out = append(out, s.Name)
		}
	}
	return out
}

// SecretValues are the values this proxy holds, by name (those it has), for a sandbox
// made again from this one's config (roched's Reset, Fork), whose proxy starts without.
func (p *Proxy) SecretValues() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for _, s := range p.secrets {
		if s.Value != "" {
			out[s.Name] = s.Value
		}
	}
	return out
}

// substitute puts the values of the secrets bound to host:port in place of their
// placeholders in h, and refuses (with the reason) a request that carries a placeholder
// where it may not go: to another host, in another header than the secret's, or in the
// URL. intercepted is false for a plain HTTP request, which never gets a value.
func (p *Proxy) substitute(h http.Header, u *url.URL, host string, port int, intercepted bool) error {
	p.mu.Lock()
	secrets := p.secrets
	p.mu.Unlock()
	target := net.JoinHostPort(host, strconv.Itoa(port))
	for _, s := range secrets {
		if s.Placeholder == "" {
			continue
		}
		if u != nil && (strings.Contains(u.RawQuery, s.Placeholder) || strings.Contains(u.EscapedPath(), s.Placeholder) ||
			strings.Contains(u.Path, s.Placeholder)) {
			return fmt.Errorf("the placeholder of secret %s is in the URL to %s: secrets go in headers only", s.Name, target)
		}
		for k, vs := range h {
			for i, v := range vs {
				if !strings.Contains(v, s.Placeholder) {
					continue
				}
				switch {
				case !intercepted || !s.bound(host, port):
					return fmt.Errorf("the placeholder of secret %s was sent to %s, which the secret is not bound to", s.Name, target)
				case s.Header != "" && !strings.EqualFold(s.Header, k):
					return fmt.Errorf("the placeholder of secret %s is in header %s; it is bound to header %s only", s.Name, k, s.Header)
				}
				if s.Value == "" {
					return fmt.Errorf("this proxy does not hold the value of secret %s (it was started again): set it again, or recreate the sandbox", s.Name)
				}
				vs[i] = strings.ReplaceAll(v, s.Placeholder, s.Value)
			}
		}
	}
	return nil
}
