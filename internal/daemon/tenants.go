package daemon

import (
	"go.opentelemetry.io/otel/trace"

	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/secretfile"
)

// Tenants. Every call is made by a tenant: the unix socket's client is LocalTenant (the
// socket is its owner's alone, mode 0600); a TCP client is whoever its bearer token
// names. A tenant sees and acts on only its own sandboxes, workspaces and snapshots;
// anything else is "not found", exactly as if it did not exist, so ids do not leak
// (the ledger keeps them apart, internal/ledger tenant.go; this file knows the tokens).

// LocalTenant is the unix socket's tenant.
const LocalTenant = ledger.LocalTenant

// DefaultTenant is the tenant of Config.Token, the single token of a daemon without a
// tokens file.
const DefaultTenant = "default"

// MinTokenLength is the shortest token roched accepts from a token file or ROCHE_TOKEN:
// a token is the only thing between the network and running code.
const MinTokenLength = secretfile.MinTokenLength

// Tenant is a TCP client known by its token, as the tokens file lists it.
type Tenant struct {
	// Name names the tenant in logs and in its sandboxes' owner: lower-case letters,
	// digits, '-' and '_', starting and ending with a letter or digit, at most 32.
	Name string `json:"name"`
	// TokenSHA256 is the hex SHA-256 of the tenant's token (roched hash-token makes it);
	// the token itself is never stored.
	TokenSHA256 string `json:"token_sha256"`
	// MaxSandboxes bounds the tenant's sandboxes at once, within the daemon's own bound
	// (0: only the daemon's).
	MaxSandboxes int `json:"max_sandboxes,omitempty"`
	// MaxTimeoutSecs bounds the lifetime the tenant may give a sandbox, at its create and
	// by SetTimeout, within roche.MaxTimeoutSecs (0: that maximum alone).
	MaxTimeoutSecs int `json:"max_timeout_secs,omitempty"`
	// MountRoots are host directories below which this tenant may mount, besides the
	// daemon's --allow-mount-root ones.
	MountRoots []string `json:"mount_roots,omitempty"`
	// ReadOnlyTokenSHA256 are the hashes of tokens that act as this tenant with the
	// read-only role: they see what its own token sees and change nothing (console.go).
	ReadOnlyTokenSHA256 []string `json:"read_only_token_sha256,omitempty"`
}

// TokensFile is the --tokens-file format.
type TokensFile struct {
	Tenants []Tenant `json:"tenants"`
}

// HashToken returns the hex SHA-256 of a token, as TokenSHA256 holds it.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// checkPrivate is secretfile.CheckPrivate: one guard for every secret file.
func checkPrivate(path, what string) error { return secretfile.CheckPrivate(path, what) }

// ReadTokenFile reads the single token of --token-file: the whole file, surrounding
// whitespace trimmed. The file must be private to its owner.
func ReadTokenFile(path string) (string, error) { return secretfile.ReadToken(path, "--token-file") }

func checkToken(tok, from string) error { return secretfile.CheckToken(tok, from) }

// LoadTokensFile reads and checks a --tokens-file. Like a token file it must be private
// to its owner: the hashes are no secret for random tokens, but whoever can change the
// file can let themselves in.
func LoadTokensFile(path string) ([]Tenant, error) {
	if err := checkPrivate(path, "--tokens-file"); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: --tokens-file: %v", roche.ErrInvalidConfig, err)
	}
	var tf TokensFile
	if err := decodeOne(b, &tf); err != nil {
		return nil, fmt.Errorf("%w: tokens file %s: %v (see roched --help for the format)", roche.ErrInvalidConfig, path, err)
	}
	if len(tf.Tenants) == 0 {
		return nil, fmt.Errorf("%w: tokens file %s lists no tenants", roche.ErrInvalidConfig, path)
	}
	return tf.Tenants, nil
}

// validTenantName: see Tenant.Name. "--" is what separates a tenant's name from a
// workspace's in the provider, so a name never holds it.
func validTenantName(s string) bool {
	if s == "" || len(s) > 32 || strings.Contains(s, "--") {
		return false
	}
	for i, r := range s {
		alnum := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || i == len(s)-1 || r != '-' && r != '_') {
			return false
		}
	}
	return true
}

// tenant is a tenant as the edge knows it: what the ledger needs, and its token's hash.
type tenant struct {
	ledger.Tenant
	hash [sha256.Size]byte
	// readOnly: its role is RoleReadOnly.
	readOnly bool
}

// validateTenants reports every problem with the tenants of cfg.
func (c Config) validateTenants() []error {
	var errs []error
	names := map[string]bool{}
	hashes := map[string]string{}
	if c.Token != "" {
		names[DefaultTenant] = true
		hashes[HashToken(c.Token)] = DefaultTenant
	}
	for _, t := range c.Tenants {
		switch {
		case !validTenantName(t.Name):
			errs = append(errs, fmt.Errorf("%w: tenant name %q: use lower-case letters, digits, '-' and '_' (no \"--\"), starting and ending with a letter or digit, at most 32",
				roche.ErrInvalidConfig, t.Name))
		case t.Name == LocalTenant:
			errs = append(errs, fmt.Errorf("%w: tenant name %q is the unix socket's: choose another", roche.ErrInvalidConfig, t.Name))
		case names[t.Name]:
			errs = append(errs, fmt.Errorf("%w: tenant %q is listed twice (%q is also the tenant of --token-file or ROCHE_TOKEN)",
				roche.ErrInvalidConfig, t.Name, DefaultTenant))
		}
		names[t.Name] = true
		h := strings.ToLower(t.TokenSHA256)
		if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
			errs = append(errs, fmt.Errorf("%w: tenant %q: token_sha256 must be 64 hex digits (roched hash-token makes it)", roche.ErrInvalidConfig, t.Name))
		} else if other, dup := hashes[h]; dup {
			errs = append(errs, fmt.Errorf("%w: tenants %q and %q have the same token: give each its own", roche.ErrInvalidConfig, other, t.Name))
		} else {
			hashes[h] = t.Name
		}
		if t.MaxTimeoutSecs < 0 || t.MaxTimeoutSecs > roche.MaxTimeoutSecs {
			errs = append(errs, fmt.Errorf("%w: tenant %q: max_timeout_secs %d: give 1 to %d seconds, or leave it out", roche.ErrInvalidConfig, t.Name, t.MaxTimeoutSecs, roche.MaxTimeoutSecs))
		}
		for _, ro := range t.ReadOnlyTokenSHA256 {
			h := strings.ToLower(ro)
			if b, err := hex.DecodeString(h); err != nil || len(b) != sha256.Size {
				errs = append(errs, fmt.Errorf("%w: tenant %q: each read_only_token_sha256 must be 64 hex digits (roched hash-token makes it)", roche.ErrInvalidConfig, t.Name))
			} else if other, dup := hashes[h]; dup {
				errs = append(errs, fmt.Errorf("%w: tenants %q and %q have the same token (a read-only one): give each its own", roche.ErrInvalidConfig, other, t.Name))
			} else {
				hashes[h] = t.Name
			}
		}
		if t.MaxSandboxes < 0 {
			errs = append(errs, fmt.Errorf("%w: tenant %q: max_sandboxes %d is negative", roche.ErrInvalidConfig, t.Name, t.MaxSandboxes))
		}
		for _, r := range t.MountRoots {
			if _, err := canonicalRoot(r); err != nil {
				errs = append(errs, fmt.Errorf("tenant %q: %w", t.Name, err))
			}
		}
	}
	for _, r := range c.AllowMountRoots {
		if _, err := canonicalRoot(r); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// canonicalRoot resolves an operator's mount root to the directory it names, without
// symlinks (the operator's links are trusted; a tenant's path is not).
func canonicalRoot(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%w: mount root %q is not an absolute path", roche.ErrInvalidConfig, dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err == nil {
		var fi fs.FileInfo
		if fi, err = os.Stat(real); err == nil && !fi.IsDir() {
			err = errors.New("not a directory")
		}
	}
	if err != nil {
		return "", fmt.Errorf("%w: mount root %s: %v", roche.ErrInvalidConfig, dir, err)
	}
	return real, nil
}

// buildTenants turns a validated config's tenants into what authenticate matches.
func buildTenants(c Config) []*tenant {
	var global []string
	for _, r := range c.AllowMountRoots {
		real, _ := canonicalRoot(r)
		global = append(global, real)
	}
	var out []*tenant
	if c.Token != "" {
		out = append(out, &tenant{Tenant: ledger.Tenant{Name: DefaultTenant, MountRoots: global}, hash: sha256.Sum256([]byte(c.Token))})
	}
	for _, t := range c.Tenants {
		nt := &tenant{Tenant: ledger.Tenant{Name: t.Name, MaxSandboxes: t.MaxSandboxes, MaxTimeoutSecs: t.MaxTimeoutSecs, MountRoots: append([]string(nil), global...)}}
		b, _ := hex.DecodeString(strings.ToLower(t.TokenSHA256))
		copy(nt.hash[:], b)
		for _, r := range t.MountRoots {
			real, _ := canonicalRoot(r)
			nt.MountRoots = append(nt.MountRoots, real)
		}
		out = append(out, nt)
		for _, ro := range t.ReadOnlyTokenSHA256 {
			viewer := &tenant{Tenant: nt.Tenant, readOnly: true}
			b, _ := hex.DecodeString(strings.ToLower(ro))
			copy(viewer.hash[:], b)
			out = append(out, viewer)
		}
	}
	return out
}

// match returns the tenant whose token this is, comparing its hash with every tenant's
// in constant time, or nil.
func match(tenants []*tenant, token string) *tenant {
	sum := sha256.Sum256([]byte(token))
	var found *tenant
	for _, t := range tenants {
		if subtle.ConstantTimeCompare(sum[:], t.hash[:]) == 1 {
			found = t
		}
	}
	return found
}

type tenantKey struct{}

func withTenant(ctx context.Context, t *tenant) context.Context {
	return context.WithValue(ctx, tenantKey{}, t)
}

// tenantOf returns the tenant a call was authenticated as, as the ledger knows it. Every
// listener sets one, so none is a bug; it is then refused rather than served as anybody.
func tenantOf(ctx context.Context) (*ledger.Tenant, error) {
	if t, ok := ctx.Value(tenantKey{}).(*tenant); ok && t != nil {
		return &t.Tenant, nil
	}
	return nil, fmt.Errorf("%w: the call has no tenant", roche.ErrPermission)
}

// remoteMounts reports whether some TCP tenant may mount host paths.
func (c Config) remoteMounts() bool {
	if len(c.AllowMountRoots) > 0 {
		return true
	}
	return slices.ContainsFunc(c.Tenants, func(t Tenant) bool { return len(t.MountRoots) > 0 })
}

// audit logs one line of the audit trail for a call: which tenant did what to which
// sandbox, and whether it worked (ledger.Audit writes it).
func (d *Daemon) audit(ctx context.Context, op string, err error, attrs ...any) {
	name := "?"
	if t, terr := tenantOf(ctx); terr == nil {
		name = t.Name
	}
	if d.traces != nil {
		// The audit line names its trace, to find one from the other.
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			attrs = append(attrs, "trace_id", sc.TraceID().String())
		}
	}
	d.ledger.Audit(name, op, err, attrs...)
}
