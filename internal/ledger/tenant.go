package ledger

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
)

// Tenants. Every call is made by a tenant: the unix socket's client is LocalTenant; a
// TCP client is whoever its bearer token names (the edge authenticates, internal/daemon
// tenants.go). A tenant sees and acts on only its own sandboxes, workspaces and
// snapshots; anything else is "not found", exactly as if it did not exist, so ids do not
// leak.

// LocalTenant is the unix socket's tenant.
const LocalTenant = "local"

// Tenant is whom a call is for, as the ledger needs to know it.
type Tenant struct {
	// Name names the tenant in logs and in its sandboxes' owner.
	Name string
	// MaxSandboxes bounds its sandboxes (0: only the daemon's bound).
	MaxSandboxes int
	// MaxTimeoutSecs bounds the lifetime it may give a sandbox, at its create and by
	// SetTimeout (0: roche.MaxTimeoutSecs).
	MaxTimeoutSecs int
	// MountRoots are the canonical directories below which it may mount; Local may
	// mount anywhere.
	MountRoots []string
	// Local: the unix socket's tenant, the operator.
	Local bool
	// Direct: the unix socket's caller runs as roched's own user (its SO_PEERCRED uid),
	// so it is served that user's direct-mode sandboxes too (Config.DirectOwner,
	// direct.go). Never set for a TCP tenant, nor for another uid on the socket.
	Direct bool
}

// Namespaced is the provider's name for a tenant's workspace or snapshot: the local
// tenant's names are kept as they are (the same as in direct mode), every other
// tenant's are prefixed "TENANT--", so two tenants can use one name without sharing.
func (t *Tenant) Namespaced(name, what string) (string, error) {
	if name == "" {
		return "", nil
	}
	if strings.Contains(name, "--") {
		return "", fmt.Errorf("%w: %s name %q: \"--\" is reserved by roched to keep tenants apart", roche.ErrInvalidConfig, what, name)
	}
	if t.Local {
		return name, nil
	}
	full := t.Name + "--" + name
	if !roche.ValidWorkspaceName(name) || !roche.ValidWorkspaceName(full) {
		return "", fmt.Errorf("%w: %s name %q: use letters, digits, '_', '.' and '-', starting with a letter or digit, at most %d characters for tenant %s",
			roche.ErrInvalidConfig, what, name, 64-len(t.Name)-2, t.Name)
	}
	return full, nil
}

// Owns reports whether the provider's name for a workspace or snapshot is the tenant's,
// and returns the name the tenant knows it by.
func (t *Tenant) Owns(full string) (string, bool) {
	prefix, rest, namespaced := strings.Cut(full, "--")
	if t.Local {
		return full, !namespaced
	}
	return rest, namespaced && prefix == t.Name
}

// mountPinner is a provider that binds host mounts from what it opened itself, so that
// a path checked here cannot be redirected before the bind (docker.WithPinnedMounts).
type mountPinner interface{ PinsMounts() bool }

// permit checks what tenant t may ask of a create and returns the config to make: with
// t's workspace and snapshot names, and host mounts only where the operator allows them.
func (l *Ledger) permit(t *Tenant, p roche.Provider, cfg roche.Config) (roche.Config, error) {
	cfg.Mounts = slices.Clone(cfg.Mounts)
	var err error
	if cfg.Workspace, err = t.Namespaced(cfg.Workspace, "workspace"); err != nil {
		return cfg, err
	}
	if cfg.FromSnapshot, err = t.Namespaced(cfg.FromSnapshot, "snapshot"); err != nil {
		return cfg, err
	}
	if err := t.permitTimeout(cfg.TimeoutSecs); err != nil {
		return cfg, err
	}
	if !l.cfg.AllowRootSandboxes {
		if err := refuseRoot(cfg.User); err != nil {
			return cfg, err
		}
	}
	if cfg.Image, err = permitImage(t, p, cfg.Image); err != nil {
		return cfg, err
	}
	return cfg, l.permitMounts(t, p, cfg.Mounts)
}

// LayoutPrefix, before a host directory, names an image in an OCI image layout, which
// the oci provider reads (oci.LayoutPrefix; internal/inproc's tests hold the two
// together).
const LayoutPrefix = "oci-layout:"

// layoutPinner is a provider that opens image layouts without following links, so that
// a path checked here cannot be redirected before it is read (oci.WithPinnedLayouts).
type layoutPinner interface{ PinsLayouts() bool }

// permitImage checks an image that names a host directory (LayoutPrefix). The local
// tenant may name any (resolved here, so that a pinning provider opens what its links
// point to). A TCP tenant may name only a canonical path at or below one of its mount
// roots, whose files it may read through a mount anyway, checked as a string, so that
// nothing outside them is looked at and the answer is the same whether or not the path
// exists; and only through a provider that pins layouts.
func permitImage(t *Tenant, p roche.Provider, image string) (string, error) {
	spec, ok := strings.CutPrefix(image, LayoutPrefix)
	if !ok {
		return image, nil
	}
	dir, digest, hasDigest := strings.Cut(spec, "@")
	if t.Local {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		if hasDigest {
			dir += "@" + digest
		}
		return LayoutPrefix + dir, nil
	}
	if len(t.MountRoots) == 0 {
		return image, fmt.Errorf("%w: image %q: tenant %s may not use images from host paths: roched's operator allows directories with --allow-mount-root (or mount_roots in the tokens file)",
			roche.ErrPermission, image, t.Name)
	}
	if !below(t.MountRoots, dir) {
		return image, fmt.Errorf("%w: image %q: host path %q is not at or below a directory tenant %s may use (%s)",
			roche.ErrPermission, image, dir, t.Name, strings.Join(t.MountRoots, ", "))
	}
	if lp, ok := p.(layoutPinner); !ok || !lp.PinsLayouts() {
		return image, fmt.Errorf("%w: image %q from tenant %s: the %s provider does not read image layouts pinned against links; only the oci provider under roched serves remote tenants' layouts",
			roche.ErrUnsupported, image, t.Name, p.Name())
	}
	return image, nil
}

// below reports whether path is a canonical absolute path (no . or .., no trailing
// slash) at or below one of roots, on the strings alone.
func below(roots []string, path string) bool {
	return filepath.IsAbs(path) && filepath.Clean(path) == path && slices.ContainsFunc(roots, func(root string) bool {
		return path == root || strings.HasPrefix(path, root+"/") || root == "/"
	})
}

// refuseRoot refuses a user that is, or may be, root: uid or gid 0, or a name, which the
// image (or a snapshot, whose /etc/passwd a writable sandbox could have changed) may map
// to uid 0. Only numbers say for sure; roche.UserAuto is a uid the provider draws from a
// range far from 0.
func refuseRoot(user string) error {
	if user == roche.UserAuto {
		return nil
	}
	uid, gid, hasGID := strings.Cut(user, ":")
	isRoot := func(s string) bool {
		n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
		return err != nil || n == 0
	}
	if isRoot(uid) || hasGID && isRoot(gid) {
		return fmt.Errorf("%w: user %q is or may be root (uid or gid 0, or a name the image decides): give non-zero uid[:gid] numbers such as %s; roched runs root sandboxes only when started with --allow-root-sandboxes",
			roche.ErrPermission, user, roche.DefaultUser)
	}
	return nil
}

// permitMounts checks host mounts. The local tenant may mount anywhere (its sources are
// resolved here, so that a pinning provider binds what its links point to). A TCP tenant
// may mount only a canonical path (no symbolic link, no . or ..) at or below one of its
// mount roots, and only through a provider that pins mounts: the check here is then
// made good at the bind, where the provider walks the same path refusing any link.
func (l *Ledger) permitMounts(t *Tenant, p roche.Provider, mounts []roche.Mount) error {
	if len(mounts) == 0 {
		return nil
	}
	if t.Local {
		for i, m := range mounts {
			if real, err := filepath.EvalSymlinks(m.Source); err == nil {
				mounts[i].Source = real
			}
		}
		return nil
	}
	if len(t.MountRoots) == 0 {
		return fmt.Errorf("%w: tenant %s may not mount host paths: roched's operator allows directories with --allow-mount-root (or mount_roots in the tokens file)",
			roche.ErrPermission, t.Name)
	}
	if mp, ok := p.(mountPinner); !ok || !mp.PinsMounts() {
		return fmt.Errorf("%w: host mounts from tenant %s: the %s provider binds mount paths as they are when it uses them, which a sandbox could redirect; only a provider that pins them (docker under roched) serves remote tenants' mounts",
			roche.ErrUnsupported, t.Name, p.Name())
	}
	for _, m := range mounts {
		src := m.Source
		// Where it lies is checked on the string first, so that a tenant learns nothing
		// of the host outside its roots.
		if !below(t.MountRoots, src) {
			return fmt.Errorf("%w: mount source %q is not at or below a directory tenant %s may mount (%s)",
				roche.ErrPermission, src, t.Name, strings.Join(t.MountRoots, ", "))
		}
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			return fmt.Errorf("%w: mount source %s: %v", roche.ErrInvalidConfig, src, err)
		}
		if real != src {
			return fmt.Errorf("%w: mount source %s goes through a symbolic link (to %s): give a path without links", roche.ErrInvalidConfig, src, real)
		}
	}
	return nil
}

// Audit logs one line of the audit trail: which tenant did what to which sandbox, and
// whether it worked. attrs name the sandbox and what was asked (an argv, a path); the
// line goes to the daemon's logger (JSON with --log-format json). The edge logs its
// calls with it, the reaper its expiries.
func (l *Ledger) Audit(tenant, op string, err error, attrs ...any) {
	args := append([]any{"op", op, "tenant", tenant}, attrs...)
	if err != nil {
		args = append(args, "ok", false, "err", err.Error())
	} else {
		args = append(args, "ok", true)
	}
	l.log.Info("audit", args...)
	if l.auditSink != nil {
		e := AuditEntry{Time: time.Now(), Tenant: tenant, Op: op, OK: err == nil, Attrs: map[string]any{}}
		if err != nil {
			e.Err = err.Error()
		}
		for i := 0; i+1 < len(attrs); i += 2 {
			if k, ok := attrs[i].(string); ok {
				e.Attrs[k] = attrs[i+1]
			}
		}
		l.auditSink(e)
	}
}

// permitTimeout refuses a lifetime over the tenant's maximum (MaxTimeoutSecs).
func (t *Tenant) permitTimeout(secs int) error {
	if t.MaxTimeoutSecs > 0 && secs > t.MaxTimeoutSecs {
		return fmt.Errorf("%w: a lifetime of %d s is over tenant %s's maximum of %d s: ask for at most that", roche.ErrInvalidConfig, secs, t.Name, t.MaxTimeoutSecs)
	}
	return nil
}
