package egress

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Where a sandbox with a CA finds it: the trust store at SandboxBundle (the host's roots
// and the sandbox's CA, replacing the image's bundle at Debian's path), and the CA alone
// at SandboxCACert.
const (
	SandboxBundle = "/etc/ssl/certs/ca-certificates.crt"
	SandboxCACert = "/usr/local/share/ca-certificates/roche-egress.crt"
)

// Files a provider keeps in a sandbox's socket directory on the host (never the CA's key,
// which stays in this process's memory).
const (
	bundleFile       = "egress-bundle.crt"
	caFile           = "egress-ca.crt"
	placeholdersFile = "egress-placeholders.json"
)

// SecretSpec is a secret as a sandbox's config gives it (roche.Secret).
type SecretSpec struct {
	Name, Value string
	Hosts       []string
	Header      string
	Stored      bool // from roched's store (roche.Secret.FromStore)
}

// TrustFile is a file of the host a sandbox gets read-only at Sandbox.
type TrustFile struct{ Host, Sandbox string }

// Trust is what a sandbox's container gets for interception and secrets: environment
// (the CA variables, a placeholder per secret) and files (its CA, in its trust store).
type Trust struct {
	Env   []string
	Files []TrustFile
}

// PrepareTrust readies opts for a sandbox whose provider keeps its files in dir (a
// directory private to this host user): it makes the sandbox's CA when the policy
// intercepts or secrets are given, writes its certificate to dir, and gives each secret
// a placeholder (the one dir records, for a proxy started again). It returns what the
// sandbox must get.
func PrepareTrust(opts *Options, dir, sandbox string, secrets []SecretSpec) (Trust, error) {
	placeholders := map[string]string{}
	if b, err := readRegular(filepath.Join(dir, placeholdersFile)); err == nil {
		_ = json.Unmarshal(b, &placeholders)
	}
	m, err := MakeTrust(opts, sandbox, secrets, placeholders)
	if err != nil {
		return Trust{}, err
	}
	t := Trust{Env: m.Env}
	if len(secrets) > 0 {
		b, _ := json.Marshal(m.Placeholders)
		if err := writeInPlace(filepath.Join(dir, placeholdersFile), b, 0o600); err != nil {
			return Trust{}, fmt.Errorf("recording the secrets' placeholders: %w", err)
		}
	}
	if m.CACert == nil {
		return t, nil
	}
	// Written in place (not renamed), so that a sandbox already running, whose container
	// binds these files, sees the CA of a proxy started again.
	for _, f := range []struct {
		name string
		b    []byte
	}{{caFile, m.CACert}, {bundleFile, m.Bundle}} {
		if err := writeInPlace(filepath.Join(dir, f.name), f.b, 0o644); err != nil {
			return Trust{}, fmt.Errorf("writing the sandbox's CA certificate: %w", err)
		}
	}
	t.Files = []TrustFile{
		{Host: filepath.Join(dir, bundleFile), Sandbox: SandboxBundle},
		{Host: filepath.Join(dir, caFile), Sandbox: SandboxCACert},
	}
	return t, nil
}

// TrustPEM is what a sandbox gets for interception and secrets, for a provider that
// delivers the CA's certificate itself (not as files of this host).
type TrustPEM struct {
	// Env is the CA variables (with a CA) and NAME=PLACEHOLDER for each secret.
	Env []string
	// Placeholders are the secrets' placeholders, by name.
	Placeholders map[string]string
	// Bundle is the trust store for SandboxBundle (the host's roots and the CA), CACert
	// the CA alone for SandboxCACert; both nil when the sandbox needs no CA.
	Bundle, CACert []byte
}

// MakeTrust readies opts for a sandbox: it gives each secret its placeholder from
// placeholders (one a proxy started again keeps) or a new one, and makes the sandbox's
// CA, its key only in opts, when the policy intercepts or secrets are given.
func MakeTrust(opts *Options, sandbox string, secrets []SecretSpec, placeholders map[string]string) (TrustPEM, error) {
	t := TrustPEM{Placeholders: map[string]string{}}
	for _, s := range secrets {
		hosts, err := ParseSecretHosts(s.Name, s.Hosts)
		if err != nil {
			return TrustPEM{}, err
		}
		ph := placeholders[s.Name]
		if ph == "" {
			ph = NewPlaceholder()
		}
		t.Placeholders[s.Name] = ph
		opts.Secrets = append(opts.Secrets, Secret{Name: s.Name, Value: s.Value, Placeholder: ph, Hosts: hosts, Header: s.Header, Stored: s.Stored})
		t.Env = append(t.Env, s.Name+"="+ph)
	}
	if !opts.Policy.Intercepts() && len(secrets) == 0 {
		return t, nil
	}
	ca, err := NewCA(sandbox)
	if err != nil {
		return TrustPEM{}, fmt.Errorf("making the sandbox's egress CA: %w", err)
	}
	opts.CA = ca
	t.Bundle = append(append([]byte(nil), HostRootsPEM()...), '\n')
	t.Bundle = append(t.Bundle, ca.CertPEM...)
	t.CACert = ca.CertPEM
	t.Env = append(t.Env, trustEnv...)
	return t, nil
}

// ReservedEnv reports whether name is a variable the proxy settings or the CA set in a
// sandbox (a secret cannot be named so).
func ReservedEnv(name string) bool {
	for _, kv := range append(SandboxEnv(), trustEnv...) {
		if k, _, _ := strings.Cut(kv, "="); strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

var trustEnv = []string{
	"SSL_CERT_FILE=" + SandboxBundle, "REQUESTS_CA_BUNDLE=" + SandboxBundle, "PIP_CERT=" + SandboxBundle,
	"CURL_CA_BUNDLE=" + SandboxBundle, "NODE_EXTRA_CA_CERTS=" + SandboxCACert,
}

// NeedsCA reports whether a sandbox with this allowlist and these many secrets needs
// a CA of its own (an https:// entry, or a secret), which a provider that cannot install
// one refuses.
func NeedsCA(allowlist []string, secrets int) bool {
	if secrets > 0 {
		return true
	}
	pol, err := ParsePolicy(allowlist)
	return err == nil && pol.Intercepts()
}

// writeInPlace writes b to path (made with mode perm), keeping the file's inode if it
// exists. It follows no symlink and waits on no FIFO (O_NONBLOCK): a provider keeps dir
// out of its sandbox's reach, and one that did not must not let the sandbox aim the
// host's write elsewhere or hang it.
func writeInPlace(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	return errors.Join(err, f.Close())
}

// readRegular reads path if it is a regular file, following no symlink and waiting on
// no FIFO (as writeInPlace).
func readRegular(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return io.ReadAll(io.LimitReader(f, 1<<20))
}
