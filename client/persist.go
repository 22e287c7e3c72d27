package client

import (
	"context"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Reset implements roche.Resetter: the daemon recreates the sandbox and serves the new
// one (with a new id) as it served the old.
func (p *Provider) Reset(ctx context.Context, id string, keepWorkspace bool) (roche.SandboxInfo, error) {
	resp, err := p.c.rpc.Reset(ctx, connect.NewRequest(&rochev1.ResetRequest{SandboxId: id, WipeWorkspace: !keepWorkspace}))
	if err != nil {
		return roche.SandboxInfo{}, p.c.fromRPC(err)
	}
	sb := wire.InfoFromProto(resp.Msg.Sandbox)
	if p.c.release(id) {
		p.c.hold(sb.ID) // the new sandbox is held as the old one was
	}
	return sb, nil
}

// Workspaces implements roche.WorkspaceManager.
func (p *Provider) Workspaces(ctx context.Context) ([]roche.Workspace, error) {
	resp, err := p.c.rpc.ListWorkspaces(ctx, connect.NewRequest(&rochev1.ListWorkspacesRequest{Provider: p.name}))
	if err != nil {
		return nil, p.c.fromRPC(err)
	}
	out := make([]roche.Workspace, 0, len(resp.Msg.Workspaces))
	for _, w := range resp.Msg.Workspaces {
		out = append(out, wire.WorkspaceFromProto(w))
	}
	return out, nil
}

// RemoveWorkspace implements roche.WorkspaceManager.
func (p *Provider) RemoveWorkspace(ctx context.Context, name string) error {
	_, err := p.c.rpc.RemoveWorkspace(ctx, connect.NewRequest(&rochev1.RemoveWorkspaceRequest{Name: name, Provider: p.name}))
	return p.c.fromRPC(err)
}

// Snapshot implements roche.Snapshotter.
func (p *Provider) Snapshot(ctx context.Context, id, name string) (roche.Snapshot, error) {
	resp, err := p.c.rpc.CreateSnapshot(ctx, connect.NewRequest(&rochev1.CreateSnapshotRequest{SandboxId: id, Name: name}))
	if err != nil {
		return roche.Snapshot{}, p.c.fromRPC(err)
	}
	return wire.SnapshotFromProto(resp.Msg.Snapshot), nil
}

// Snapshots implements roche.Snapshotter.
func (p *Provider) Snapshots(ctx context.Context) ([]roche.Snapshot, error) {
	resp, err := p.c.rpc.ListSnapshots(ctx, connect.NewRequest(&rochev1.ListSnapshotsRequest{Provider: p.name}))
	if err != nil {
		return nil, p.c.fromRPC(err)
	}
	out := make([]roche.Snapshot, 0, len(resp.Msg.Snapshots))
	for _, s := range resp.Msg.Snapshots {
		out = append(out, wire.SnapshotFromProto(s))
	}
	return out, nil
}

// RemoveSnapshot implements roche.Snapshotter.
func (p *Provider) RemoveSnapshot(ctx context.Context, name string) error {
	_, err := p.c.rpc.RemoveSnapshot(ctx, connect.NewRequest(&rochev1.RemoveSnapshotRequest{Name: name, Provider: p.name}))
	return p.c.fromRPC(err)
}
