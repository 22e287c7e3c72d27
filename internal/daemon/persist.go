package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

// This file serves what outlives a sandbox or replaces it: reset, persistent
// workspaces and snapshots. Workspaces and snapshots live in the providers (a Docker
// volume, an image), not in the daemon, which only finds the provider that keeps them.

// reset recreates a sandbox with its provider and moves the daemon's record to the new
// id, so that the new sandbox is served exactly as the old one was: the same expiry,
// and the env and workdir a pooled sandbox's create asked for.
func (d *Daemon) reset(ctx context.Context, tn *tenant, id string, keepWorkspace bool) (roche.SandboxInfo, error) {
	t, err := d.resolve(tn, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	rs, ok := t.p.(roche.Resetter)
	if !ok {
		return roche.SandboxInfo{}, fmt.Errorf("%w: the %s provider cannot reset sandboxes; destroy it and create a new one", roche.ErrUnsupported, t.p.Name())
	}
	// Not cancelled midway, as for a create: a client that goes away must not leave the
	// old sandbox gone and the new one half made.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	sb, err := rs.Reset(cctx, t.id, keepWorkspace)
	if err != nil {
		if errors.Is(err, roche.ErrNotFound) && t.rec != nil {
			d.forget(t.id)
		}
		return roche.SandboxInfo{}, err
	}

	now := time.Now()
	rec := &record{
		ID: sb.ID, Provider: t.p.Name(), Image: sb.Image, Kind: kindClient, Tenant: tn.name,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, since: now,
	}
	if old := t.rec; old != nil {
		rec.Image, rec.Env, rec.Workdir, rec.Leased = old.Image, maps.Clone(old.Env), old.Workdir, old.Leased
		if !old.ExpiresAt.IsZero() {
			rec.ExpiresAt = old.ExpiresAt
		}
	}
	d.mu.Lock()
	old, tracked := d.sandboxes[t.id]
	delete(d.sandboxes, t.id)
	d.forgetHoldLocked(t.id)
	d.sandboxes[sb.ID] = rec
	d.mu.Unlock()
	if rec.Leased {
		// The client holds the new id from now on (the Go client and the SDKs move their
		// Hold over).
		d.leaseCreated(sb.ID, firstHold)
	}
	if tracked {
		d.forgetInPool(old)
	}
	d.saveOrWarn()
	sb.ExpiresAt, sb.Owner = rec.ExpiresAt, d.ownerFor(tn.name)

	// A sandbox from the pool was given its workdir after it was made; the new one is
	// made from the pool's config, so it needs it again.
	if t.rec != nil && t.rec.Pool != "" && t.rec.Workdir != "" {
		if err := makeWorkdir(cctx, t.p, sb.ID, t.rec.Workdir); err != nil {
			return sb, fmt.Errorf("sandbox %s was reset to %s, but its workdir %s could not be made again: %w", t.id, sb.ID, t.rec.Workdir, err)
		}
	}
	if ctx.Err() != nil {
		d.markDestroying(sb.ID)
		d.saveOrWarn()
		return roche.SandboxInfo{}, fmt.Errorf("resetting sandbox %s: %w (the client went away; the new sandbox was destroyed)", t.id, ctx.Err())
	}
	d.log.Debug("sandbox reset", "old", t.id, "new", sb.ID, "keep_workspace", keepWorkspace)
	return sb, nil
}

// keepers returns the providers (all, or the one named) that implement T, which is
// what keeps the things called what. Naming a provider that lacks it is an error.
func keepers[T any](d *Daemon, provider, what string) ([]T, error) {
	names := d.names
	if provider != "" {
		p, err := d.provider(provider)
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
		if k, ok := d.providers[n].(T); ok {
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
func (d *Daemon) settled(ctx context.Context) bool {
	pending := func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, r := range d.sandboxes {
			if r.Kind == kindDestroying {
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
func (d *Daemon) removeOnceSettled(ctx context.Context, rm func() error) error {
	err := rm()
	if errors.Is(err, roche.ErrInUse) && d.settled(ctx) {
		err = rm()
	}
	return err
}

// listKept gathers what each keeper (every one, or the one named) lists, ordered by
// key: a name, then a provider.
func listKept[K, V any](d *Daemon, provider, what string, list func(K) ([]V, error), key func(V) [2]string) ([]V, error) {
	ks, err := keepers[K](d, provider, what)
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
func removeKept[K any](ctx context.Context, d *Daemon, provider, what string, rm func(K) error) error {
	ks, err := keepers[K](d, provider, what)
	if err != nil {
		return err
	}
	return d.removeOnceSettled(ctx, func() error { return removeFromEach(ks, rm) })
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

func (s *service) Reset(ctx context.Context, req *connect.Request[rochev1.ResetRequest]) (*connect.Response[rochev1.ResetResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	sb, err := s.d.reset(ctx, t, req.Msg.SandboxId, !req.Msg.WipeWorkspace)
	s.d.audit(ctx, "reset", err, "id", req.Msg.SandboxId, "new_id", sb.ID)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.ResetResponse{Sandbox: wire.InfoToProto(sb)}), nil
}

func (s *service) ListWorkspaces(ctx context.Context, req *connect.Request[rochev1.ListWorkspacesRequest]) (*connect.Response[rochev1.ListWorkspacesResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	all, err := listKept(s.d, req.Msg.Provider, "persistent workspaces",
		func(wm roche.WorkspaceManager) ([]roche.Workspace, error) { return wm.Workspaces(ctx) },
		func(w roche.Workspace) [2]string { return [2]string{w.Name, w.Provider} })
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.ListWorkspacesResponse{}
	for _, w := range all {
		var mine bool
		if w.Name, mine = t.owns(w.Name); mine {
			resp.Workspaces = append(resp.Workspaces, wire.WorkspaceToProto(w))
		}
	}
	return connect.NewResponse(resp), nil
}

func (s *service) RemoveWorkspace(ctx context.Context, req *connect.Request[rochev1.RemoveWorkspaceRequest]) (*connect.Response[rochev1.RemoveWorkspaceResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	name, err := t.namespaced(req.Msg.Name, "workspace")
	if err == nil && name == "" {
		err = fmt.Errorf("%w: no workspace name given", roche.ErrInvalidConfig)
	}
	if err == nil {
		err = removeKept(ctx, s.d, req.Msg.Provider, "persistent workspaces", func(wm roche.WorkspaceManager) error {
			return wm.RemoveWorkspace(ctx, name)
		})
	}
	s.d.audit(ctx, "remove_workspace", err, "name", req.Msg.Name)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.RemoveWorkspaceResponse{}), nil
}

func (s *service) CreateSnapshot(ctx context.Context, req *connect.Request[rochev1.CreateSnapshotRequest]) (*connect.Response[rochev1.CreateSnapshotResponse], error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, err := s.d.resolve(tn, req.Msg.SandboxId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	sn, ok := t.p.(roche.Snapshotter)
	if !ok {
		return nil, wire.ToStatus(fmt.Errorf("%w: the %s provider has no snapshots", roche.ErrUnsupported, t.p.Name()))
	}
	name, err := tn.namespaced(req.Msg.Name, "snapshot")
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	snap, err := sn.Snapshot(ctx, t.id, name)
	s.d.audit(ctx, "snapshot", err, "id", t.id, "name", req.Msg.Name)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	snap.Name, _ = tn.owns(snap.Name)
	return connect.NewResponse(&rochev1.CreateSnapshotResponse{Snapshot: wire.SnapshotToProto(snap)}), nil
}

func (s *service) ListSnapshots(ctx context.Context, req *connect.Request[rochev1.ListSnapshotsRequest]) (*connect.Response[rochev1.ListSnapshotsResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	all, err := listKept(s.d, req.Msg.Provider, "snapshots",
		func(sn roche.Snapshotter) ([]roche.Snapshot, error) { return sn.Snapshots(ctx) },
		func(sn roche.Snapshot) [2]string { return [2]string{sn.Name, sn.Provider} })
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.ListSnapshotsResponse{}
	for _, sn := range all {
		var mine bool
		if sn.Name, mine = t.owns(sn.Name); mine {
			resp.Snapshots = append(resp.Snapshots, wire.SnapshotToProto(sn))
		}
	}
	return connect.NewResponse(resp), nil
}

func (s *service) RemoveSnapshot(ctx context.Context, req *connect.Request[rochev1.RemoveSnapshotRequest]) (*connect.Response[rochev1.RemoveSnapshotResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	name, err := t.namespaced(req.Msg.Name, "snapshot")
	if err == nil && name == "" {
		err = fmt.Errorf("%w: no snapshot name given", roche.ErrInvalidConfig)
	}
	if err == nil {
		err = removeKept(ctx, s.d, req.Msg.Provider, "snapshots", func(sn roche.Snapshotter) error {
			return sn.RemoveSnapshot(ctx, name)
		})
	}
	s.d.audit(ctx, "remove_snapshot", err, "name", req.Msg.Name)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.RemoveSnapshotResponse{}), nil
}
