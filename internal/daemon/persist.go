package daemon

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

// This file serves what outlives a sandbox or replaces it: reset, persistent
// workspaces and snapshots (the ledger finds the provider that keeps them,
// internal/ledger persist.go).

func (s *service) Reset(ctx context.Context, req *connect.Request[rochev1.ResetRequest]) (*connect.Response[rochev1.ResetResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	// The sandbox is made again from its config, which holds no secret's value: the new
	// proxy gets the old one's, and follows the store as it did.
	values := s.d.secretValues(t, req.Msg.SandboxId)
	sb, err := s.d.ledger.Reset(ctx, t, req.Msg.SandboxId, !req.Msg.WipeWorkspace)
	if err == nil {
		s.d.remadeEgress(t.Name, values, sb.ID)
	}
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
	all, err := s.d.ledger.Workspaces(ctx, t, req.Msg.Provider)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.ListWorkspacesResponse{}
	for _, w := range all {
		resp.Workspaces = append(resp.Workspaces, wire.WorkspaceToProto(w))
	}
	return connect.NewResponse(resp), nil
}

func (s *service) RemoveWorkspace(ctx context.Context, req *connect.Request[rochev1.RemoveWorkspaceRequest]) (*connect.Response[rochev1.RemoveWorkspaceResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	err = s.d.ledger.RemoveWorkspace(ctx, t, req.Msg.Provider, req.Msg.Name)
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
	t, err := s.d.ledger.Resolve(tn, req.Msg.SandboxId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	sn, ok := t.Provider.(roche.Snapshotter)
	if !ok {
		return nil, wire.ToStatus(fmt.Errorf("%w: the %s provider has no snapshots", roche.ErrUnsupported, t.Provider.Name()))
	}
	name, err := tn.Namespaced(req.Msg.Name, "snapshot")
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	snap, err := sn.Snapshot(ctx, t.ID, name)
	s.d.audit(ctx, "snapshot", err, "id", t.ID, "name", req.Msg.Name)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	snap.Name, _ = tn.Owns(snap.Name)
	return connect.NewResponse(&rochev1.CreateSnapshotResponse{Snapshot: wire.SnapshotToProto(snap)}), nil
}

func (s *service) ListSnapshots(ctx context.Context, req *connect.Request[rochev1.ListSnapshotsRequest]) (*connect.Response[rochev1.ListSnapshotsResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	all, err := s.d.ledger.Snapshots(ctx, t, req.Msg.Provider)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.ListSnapshotsResponse{}
	for _, sn := range all {
		resp.Snapshots = append(resp.Snapshots, wire.SnapshotToProto(sn))
	}
	return connect.NewResponse(resp), nil
}

func (s *service) RemoveSnapshot(ctx context.Context, req *connect.Request[rochev1.RemoveSnapshotRequest]) (*connect.Response[rochev1.RemoveSnapshotResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	err = s.d.ledger.RemoveSnapshot(ctx, t, req.Msg.Provider, req.Msg.Name)
	s.d.audit(ctx, "remove_snapshot", err, "name", req.Msg.Name)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.RemoveSnapshotResponse{}), nil
}
