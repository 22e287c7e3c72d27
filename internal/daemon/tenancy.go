package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/roche-sandbox/roche"
)

// mountPinner is a provider that binds host mounts from what it opened itself, so that
// a path checked here cannot be redirected before the bind (docker.WithPinnedMounts).
type mountPinner interface{ PinsMounts() bool }

// permit checks what tenant t may ask of a create and returns the config to make: owned
// by the daemon for t, with t's workspace and snapshot names, and host mounts only where
// the operator allows them.
func (d *Daemon) permit(t *tenant, p roche.Provider, cfg roche.Config) (roche.Config, error) {
	cfg.Owner = d.ownerFor(t.name)
	cfg.Mounts = slices.Clone(cfg.Mounts)
	var err error
	if cfg.Workspace, err = t.namespaced(cfg.Workspace, "workspace"); err != nil {
		return cfg, err
	}
	if cfg.FromSnapshot, err = t.namespaced(cfg.FromSnapshot, "snapshot"); err != nil {
		return cfg, err
	}
	if !d.cfg.AllowRootSandboxes {
		if err := refuseRoot(cfg.User); err != nil {
			return cfg, err
		}
	}
	return cfg, d.permitMounts(t, p, cfg.Mounts)
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
func (d *Daemon) permitMounts(t *tenant, p roche.Provider, mounts []roche.Mount) error {
	if len(mounts) == 0 {
		return nil
	}
	if t.local {
		for i, m := range mounts {
			if real, err := filepath.EvalSymlinks(m.Source); err == nil {
				mounts[i].Source = real
			}
		}
		return nil
	}
	if len(t.mountRoots) == 0 {
		return fmt.Errorf("%w: tenant %s may not mount host paths: roched's operator allows directories with --allow-mount-root (or mount_roots in the tokens file)",
			roche.ErrPermission, t.name)
	}
	if mp, ok := p.(mountPinner); !ok || !mp.PinsMounts() {
		return fmt.Errorf("%w: host mounts from tenant %s: the %s provider binds mount paths as they are when it uses them, which a sandbox could redirect; only a provider that pins them (docker under roched) serves remote tenants' mounts",
			roche.ErrUnsupported, t.name, p.Name())
	}
	for _, m := range mounts {
		src := m.Source
		// Where it lies is checked on the string first, so that a tenant learns nothing
		// of the host outside its roots.
		if !filepath.IsAbs(src) || filepath.Clean(src) != src || !slices.ContainsFunc(t.mountRoots, func(root string) bool {
			return src == root || strings.HasPrefix(src, root+"/") || root == "/"
		}) {
			return fmt.Errorf("%w: mount source %q is not at or below a directory tenant %s may mount (%s)",
				roche.ErrPermission, src, t.name, strings.Join(t.mountRoots, ", "))
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

// audit logs one line of the audit trail for a call: which tenant did what to which
// sandbox, and whether it worked. attrs name the sandbox and what was asked (an argv,
// a path); the line goes to the daemon's logger (JSON with --log-format json).
func (d *Daemon) audit(ctx context.Context, op string, err error, attrs ...any) {
	name := "?"
	if t, terr := tenantOf(ctx); terr == nil {
		name = t.name
	}
	d.auditAs(name, op, err, attrs...)
}

// auditAs is audit for a known tenant name (the reaper acts for the daemon).
func (d *Daemon) auditAs(tenant, op string, err error, attrs ...any) {
	args := append([]any{"op", op, "tenant", tenant}, attrs...)
	if err != nil {
		args = append(args, "ok", false, "err", err.Error())
	} else {
		args = append(args, "ok", true)
	}
	d.log.Info("audit", args...)
}
