package ledger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// This file serves what outlives a sandbox or replaces it: reset, persistent
// workspaces and snapshots. Workspaces and snapshots live in the providers (a Docker
// volume, an image), not in the daemon, which only finds the provider that keeps them.

// Reset recreates a sandbox with its provider and moves the daemon's record to the new
// id, so that the new sandbox is served exactly as the old one was: the same expiry,
// and the env and workdir a pooled sandbox's create asked for.
func (l *Ledger) Reset(ctx context.Context, tn *Tenant, id string, keepWorkspace bool) (roche.SandboxInfo, error) {
	t, err := l.Resolve(tn, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	rs, ok := t.Provider.(roche.Resetter)
	if !ok {
		return roche.SandboxInfo{}, fmt.Errorf("%w: the %s provider cannot reset sandboxes; destroy it and create a new one", roche.ErrUnsupported, t.Provider.Name())
	}
	// Not cancelled midway, as for a create: a client that goes away must not leave the
	// old sandbox gone and the new one half made.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	sb, err := rs.Reset(cctx, t.ID, keepWorkspace)
	if err != nil {
		if errors.Is(err, roche.ErrNotFound) && t.rec != nil {
			l.forget(t.ID)
		}
		return roche.SandboxInfo{}, err
	}

	now := time.Now()
	rec := &Record{
		ID: sb.ID, Provider: t.Provider.Name(), Image: sb.Image, Kind: KindClient, Tenant: tn.Name,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, since: now,
	}
	if old := t.rec; old != nil {
		rec.Image, rec.Env, rec.Workdir, rec.Leased = old.Image, maps.Clone(old.Env), old.Workdir, old.Leased
		// A direct-mode sandbox's provider made the new one with the old one's owner:
		// still its user's, served as before (direct.go).
		rec.direct, rec.owner, rec.adopted = old.direct, old.owner, old.direct
		if !old.ExpiresAt.IsZero() {
			rec.ExpiresAt = old.ExpiresAt
		}
	}
	l.mu.Lock()
	old, tracked := l.sandboxes[t.ID]
	if tracked {
		l.recordEnd(old, roche.EndReason{Kind: roche.EndDestroyed, By: "tenant:" + tn.Name,
			Detail: fmt.Sprintf("reset by tenant %s: replaced by sandbox %s", tn.Name, sb.ID)}, false)
	}
	delete(l.sandboxes, t.ID)
	l.forgetHoldLocked(t.ID)
	l.sandboxes[sb.ID] = rec
	l.mu.Unlock()
	if rec.Leased {
		// The client holds the new id from now on (the Go client and the SDKs move their
		// Hold over).
		l.leaseCreated(sb.ID, FirstHold)
	}
	if tracked {
		l.forgetInPool(old)
	}
	l.saveOrWarn()
	if !rec.direct {
		sb.ExpiresAt, sb.Owner = rec.ExpiresAt, l.ownerFor(tn.Name)
	}

	// A sandbox from the pool was claimed for its holder after it was made; the new one
	// is made from the pool's config, so it needs its claim, and its workdir, again.
	if c, ok := t.Provider.(kit.Claimer); ok && t.rec != nil && t.rec.Pool != "" {
		claim := kit.Claim{Owner: l.ownerFor(tn.Name), Expires: rec.ExpiresAt, Env: maps.Clone(rec.Env), Workdir: rec.Workdir}
		if err := c.Claim(cctx, sb.ID, claim); err != nil {
			l.log.Warn("claiming a reset pooled sandbox for its holder (a restart without the state file would take it for the pool's)", "id", sb.ID, "err", err)
		}
	}
	if t.rec != nil && t.rec.Pool != "" && t.rec.Workdir != "" {
		if err := makeWorkdir(cctx, t.Provider, sb.ID, t.rec.Workdir); err != nil {
			return sb, fmt.Errorf("sandbox %s was reset to %s, but its workdir %s could not be made again: %w", t.ID, sb.ID, t.rec.Workdir, err)
		}
	}
	if ctx.Err() != nil {
		return roche.SandboxInfo{}, l.abandon(ctx, sb.ID, "resetting sandbox "+t.ID, "the new sandbox")
	}
	l.log.Debug("sandbox reset", "old", t.ID, "new", sb.ID, "keep_workspace", keepWorkspace)
	return sb, nil
}

// keepers returns the providers (all, or the one named) that implement T, which is
// what keeps the things called what. Naming a provider that lacks it is an error.
func keepers[T any](l *Ledger, provider, what string) ([]T, error) {
	names := l.names
	if provider != "" {
		p, err := l.Provider(provider)
		if err != nil {
			return nil, err
		}
		if _, ok := p.(T); !ok {
			return nil, fmt.Errorf("%w: the %s provider has no %s", roche.ErrUnsupported, p.Name(), what)
		}
		names = []string{p.Name()}
	}
	var out []T
	for _, n := range names {
		if k, ok := l.providers[n].(T); ok {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no provider this daemon serves has %s", roche.ErrUnsupported, what)
	}
	return out, nil
}

// settled waits (up to a bound) until the sandboxes marked destroyed have been removed:
// a destroy returns before its removal, and until then a workspace or snapshot the
// sandbox used is still in use. It reports whether there was anything to wait for.
func (l *Ledger) settled(ctx context.Context) bool {
	pending := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, r := range l.sandboxes {
			if r.Kind == KindDestroying {
				return true
			}
		}
		return false
	}
	if !pending() {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for pending() {
		select {
		case <-ctx.Done():
			return true
		case <-time.After(20 * time.Millisecond):
		}
	}
	return true
}

// removeOnceSettled removes with rm, and when that is refused as in use while destroyed
// sandboxes are still being removed, waits for them and tries again.
func (l *Ledger) removeOnceSettled(ctx context.Context, rm func() error) error {
	err := rm()
	if errors.Is(err, roche.ErrInUse) && l.settled(ctx) {
		err = rm()
	}
	return err
}

// listKept gathers what each keeper (every one, or the one named) lists, ordered by
// key: a name, then a provider.
func listKept[K, V any](l *Ledger, provider, what string, list func(K) ([]V, error), key func(V) [2]string) ([]V, error) {
	ks, err := keepers[K](l, provider, what)
	if err != nil {
		return nil, err
	}
	var all []V
	var errs []error
	for _, k := range ks {
		vs, err := list(k)
		errs = append(errs, err)
		all = append(all, vs...)
	}
	slices.SortFunc(all, func(a, b V) int {
		ka, kb := key(a), key(b)
		return cmp.Or(strings.Compare(ka[0], kb[0]), strings.Compare(ka[1], kb[1]))
	})
	return all, errors.Join(errs...)
}

// removeKept removes a thing from the keeper named, or from whichever keeps it.
func removeKept[K any](ctx context.Context, l *Ledger, provider, what string, rm func(K) error) error {
	ks, err := keepers[K](l, provider, what)
	if err != nil {
		return err
	}
	return l.removeOnceSettled(ctx, func() error { return removeFromEach(ks, rm) })
}

// removeFromEach removes a thing from each keeper, succeeding when one had it: a name
// alone does not say which provider keeps it. When none had it, the first keeper's
// "not found" is the answer.
func removeFromEach[T any](keepers []T, rm func(T) error) error {
	var errs []error
	var notFound error
	removed := false
	for _, k := range keepers {
		err := rm(k)
		switch {
		case err == nil:
			removed = true
		case errors.Is(err, roche.ErrNotFound):
			if notFound == nil {
				notFound = err
			}
		default:
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil || removed {
		return err
	}
	return notFound
}

// Workspaces lists tenant t's persistent workspaces (every provider's that keeps them,
// or the one named's), by the names t knows them by.
func (l *Ledger) Workspaces(ctx context.Context, t *Tenant, provider string) ([]roche.Workspace, error) {
	return listOwned(l, t, provider, "persistent workspaces",
		func(wm roche.WorkspaceManager) ([]roche.Workspace, error) { return wm.Workspaces(ctx) },
		func(w *roche.Workspace) (*string, string) { return &w.Name, w.Provider })
}

// RemoveWorkspace removes tenant t's workspace name, once the sandboxes being destroyed
// no longer use it.
func (l *Ledger) RemoveWorkspace(ctx context.Context, t *Tenant, provider, name string) error {
	return removeOwned(ctx, l, t, provider, "persistent workspaces", "workspace", name,
		func(wm roche.WorkspaceManager, name string) error { return wm.RemoveWorkspace(ctx, name) })
}

// Snapshots lists tenant t's snapshots (every provider's that keeps them, or the one
// named's), by the names t knows them by.
func (l *Ledger) Snapshots(ctx context.Context, t *Tenant, provider string) ([]roche.Snapshot, error) {
	return listOwned(l, t, provider, "snapshots",
		func(sn roche.Snapshotter) ([]roche.Snapshot, error) { return sn.Snapshots(ctx) },
		func(sn *roche.Snapshot) (*string, string) { return &sn.Name, sn.Provider })
}

// RemoveSnapshot removes tenant t's snapshot name, once the sandboxes being destroyed
// no longer use it.
func (l *Ledger) RemoveSnapshot(ctx context.Context, t *Tenant, provider, name string) error {
	return removeOwned(ctx, l, t, provider, "snapshots", "snapshot", name,
		func(sn roche.Snapshotter, name string) error { return sn.RemoveSnapshot(ctx, name) })
}

// listOwned is listKept of what is tenant t's, renamed to the names t knows; id gives a
// thing's name (to rename in place) and its provider.
func listOwned[K, V any](l *Ledger, t *Tenant, provider, what string, list func(K) ([]V, error), id func(*V) (*string, string)) ([]V, error) {
	all, err := listKept(l, provider, what, list, func(v V) [2]string {
		name, keeper := id(&v)
		return [2]string{*name, keeper}
	})
	if err != nil {
		return nil, err
	}
	var out []V
	for _, v := range all {
		name, _ := id(&v)
		var mine bool
		if *name, mine = t.Owns(*name); mine {
			out = append(out, v)
		}
	}
	return out, nil
}

// removeOwned is removeKept of tenant t's thing called name, a kind ("workspace").
func removeOwned[K any](ctx context.Context, l *Ledger, t *Tenant, provider, what, kind, name string, rm func(K, string) error) error {
	full, err := t.Namespaced(name, kind)
	if err == nil && full == "" {
		err = fmt.Errorf("%w: no %s name given", roche.ErrInvalidConfig, kind)
	}
	if err != nil {
		return err
	}
	return removeKept(ctx, l, provider, what, func(k K) error { return rm(k, full) })
}
