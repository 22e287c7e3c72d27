package daemon

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/ledger"
)

// TLS on roched's TCP listener. The certificate, its key and the client CA are files
// read again whenever they change: each new connection, and a check every few seconds,
// compare the files' bytes with those in use, so a renewed certificate is served to the
// next connection without a restart while connections already open keep theirs. A new
// set that does not load (a half-written file, a key that does not match) leaves the one
// in use in place, and the log says why, once per bad set.

// tlsReloadInterval is how often the files are checked besides at each handshake, so
// that a bad new file is logged without waiting for a client.
const tlsReloadInterval = 5 * time.Second

// tlsFiles serves the TLS settings of the files it was made from.
type tlsFiles struct {
	certFile, keyFile, caFile string
	log                       *slog.Logger

	mu sync.Mutex
	// seen are the bytes of the files last read, in order cert, key, CA; bad is the set
	// last refused, so that it is logged once.
	seen, bad [3][]byte
	config    *tls.Config
	serial    string
}

// newTLSFiles loads the files once: at start a bad file is an error, not a warning.
func newTLSFiles(certFile, keyFile, caFile string, log *slog.Logger) (*tlsFiles, error) {
	t := &tlsFiles{certFile: certFile, keyFile: keyFile, caFile: caFile, log: log}
	files, err := t.read()
	if err == nil {
		err = t.load(files)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
	}
	return t, nil
}

func (t *tlsFiles) read() ([3][]byte, error) {
	var out [3][]byte
	for i, f := range []string{t.certFile, t.keyFile, t.caFile} {
		if f == "" {
			continue
		}
		if i == 1 {
			if err := checkKeyFile(f); err != nil {
				return out, err
			}
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return out, err
		}
		out[i] = b
	}
	return out, nil
}

// checkKeyFile refuses a private key that every local user can read. Group access is
// allowed: a Kubernetes Secret mounted with an fsGroup is group-readable.
func checkKeyFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if perm := fi.Mode().Perm(); perm&0o007 != 0 {
		return fmt.Errorf("--tls-key %s is open to others (mode %04o): anyone on this host could impersonate roched; chmod 600 %s", path, perm, path)
	}
	return nil
}

// load parses files and, when they make a working set, puts it in use.
func (t *tlsFiles) load(files [3][]byte) error {
	pair, err := tls.X509KeyPair(files[0], files[1])
	if err != nil {
		return fmt.Errorf("--tls-cert %s and --tls-key %s: %v", t.certFile, t.keyFile, err)
	}
	leaf := pair.Leaf
	cfg := &tls.Config{
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
	}
	if t.caFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(files[2]) {
			return fmt.Errorf("--client-ca %s holds no PEM certificate", t.caFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		// Served all the same (clients refuse it, naming the expiry): refusing to start
		// or to reload would not make a valid one appear.
		t.log.Warn("the TLS certificate is not valid now: clients will refuse it; renew it (roched reloads it)",
			"cert", t.certFile, "not_before", leaf.NotBefore, "not_after", leaf.NotAfter)
	}
	t.seen, t.config, t.serial = files, cfg, leaf.SerialNumber.Text(16)
	return nil
}

// refresh reads the files and loads them when they changed.
func (t *tlsFiles) refresh() {
	t.mu.Lock()
	defer t.mu.Unlock()
	files, err := t.read()
	if err == nil && same(files, t.seen) {
		return
	}
	if err == nil {
		if err = t.load(files); err == nil {
			t.log.Info("TLS certificate reloaded", "cert", t.certFile, "serial", t.serial)
			return
		}
	}
	if !same(files, t.bad) {
		t.bad = files
		t.log.Error("TLS files changed but do not load: still serving the certificate in use", "serial", t.serial, "err", err)
	}
}

func same(a, b [3][]byte) bool {
	return bytes.Equal(a[0], b[0]) && bytes.Equal(a[1], b[1]) && bytes.Equal(a[2], b[2])
}

// serverConfig is the listener's tls.Config: each handshake gets the settings of the
// files as they are now.
func (t *tlsFiles) serverConfig() *tls.Config {
	return &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			t.refresh()
			t.mu.Lock()
			defer t.mu.Unlock()
			return t.config, nil
		},
		NextProtos: []string{"h2", "http/1.1"},
	}
}

// watch checks the files every interval until done is closed.
func (t *tlsFiles) watch(done <-chan struct{}, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			t.refresh()
		}
	}
}

// validateTLS reports the problems of the TLS settings and of plaintext on a host others
// can reach.
func (c Config) validateTLS(host string) []error {
	return c.validateTLSOf(c.Listen, host, true)
}

// validateTLSOf is validateTLS for the listener named what on host; pair reports the
// problems of the certificate settings themselves too (once, for the first listener).
func (c Config) validateTLSOf(what, host string, pair bool) []error {
	var errs []error
	if pair && (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, fmt.Errorf("%w: give both --tls-cert FILE and --tls-key FILE", roche.ErrInvalidConfig))
	}
	if pair && c.ClientCA != "" && c.TLSCert == "" {
		errs = append(errs, fmt.Errorf("%w: --client-ca needs TLS: give --tls-cert FILE and --tls-key FILE too", roche.ErrInvalidConfig))
	}
	if c.TLSCert == "" && !c.Insecure && !isLoopback(host) {
		errs = append(errs, fmt.Errorf("%w: refusing plaintext TCP on %s, which is not a loopback address: anyone on the path could read the bearer token; give --tls-cert FILE and --tls-key FILE, or let roche daemon start --tls make a local CA, or pass --insecure",
			roche.ErrInvalidConfig, what))
	}
	return errs
}

// isLoopback reports whether every address host names is a loopback one: an IP address
// in 127.0.0.0/8 or ::1, or a name that resolves only to such. An empty host (every
// address) or 0.0.0.0 is not.
func isLoopback(host string) bool {
	if host == "" {
		return false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().IsLoopback()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if !a.Unmap().IsLoopback() {
			return false
		}
	}
	return true
}

// certTenant returns the tenant a verified client certificate names (its Subject Common
// Name): one of the configured tenants, or else a tenant of that name known by its
// certificate alone (the CA vouches for it), with the daemon's mount roots.
func (d *Daemon) certTenant(name string) (*tenant, error) {
	for _, t := range d.tenants {
		if t.Name == name && !t.readOnly {
			return t, nil
		}
	}
	if !validTenantName(name) || name == LocalTenant {
		return nil, fmt.Errorf("the client certificate's Common Name %q is not a tenant name (lower-case letters, digits, '-' and '_', not %q)", name, LocalTenant)
	}
	d.certMu.Lock()
	defer d.certMu.Unlock()
	if t, ok := d.certTenants[name]; ok {
		return t, nil
	}
	t := &tenant{Tenant: ledger.Tenant{Name: name, MountRoots: d.globalMountRoots()}}
	if d.certTenants == nil {
		d.certTenants = map[string]*tenant{}
	}
	d.certTenants[name] = t
	return t, nil
}

// globalMountRoots are the --allow-mount-root directories, resolved.
func (d *Daemon) globalMountRoots() []string {
	var out []string
	for _, r := range d.cfg.AllowMountRoots {
		real, _ := canonicalRoot(r)
		out = append(out, real)
	}
	return out
}

// callerTenant is who a TCP request is from: the tenant of its bearer token, of its
// verified client certificate, or of both when they agree. A token and a certificate
// naming different tenants is refused, never settled by picking one.
func (d *Daemon) callerTenant(cs *tls.ConnectionState, token string, hasToken bool) (*tenant, error) {
	var byCert *tenant
	if cs != nil && len(cs.VerifiedChains) > 0 && len(cs.VerifiedChains[0]) > 0 {
		t, err := d.certTenant(cs.VerifiedChains[0][0].Subject.CommonName)
		if err != nil {
			return nil, err
		}
		byCert = t
	}
	if !hasToken {
		if byCert != nil {
			return byCert, nil
		}
		return nil, errors.New("missing bearer token: send Authorization: Bearer TOKEN (a token roched knows: its --token-file, ROCHE_TOKEN or --tokens-file)")
	}
	byToken := match(d.tenants, token)
	if byToken == nil {
		return nil, errors.New("wrong bearer token: send Authorization: Bearer TOKEN (a token roched knows: its --token-file, ROCHE_TOKEN or --tokens-file)")
	}
	if byCert != nil && byCert.Name != byToken.Name {
		return nil, fmt.Errorf("the client certificate names tenant %q but the bearer token tenant %q: send that tenant's token, or none", byCert.Name, byToken.Name)
	}
	return byToken, nil
}
