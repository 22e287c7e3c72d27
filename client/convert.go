package client

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// configToProto sends every field explicitly, so the daemon's defaults for fields left
// out never replace what the caller asked for (a zero cpus is refused, not defaulted).
func configToProto(cfg roche.Config) *rochev1.SandboxConfig {
	pb := &rochev1.SandboxConfig{
		Image: &cfg.Image, Network: cfg.Network, Writable: cfg.Writable, TimeoutSecs: ptr(clampInt32(cfg.TimeoutSecs)),
		Memory: &cfg.Memory, Cpus: &cfg.CPUs, PidsLimit: ptr(clampInt32(cfg.PidsLimit)), Env: cfg.Env,
		Workdir: cfg.Workdir, User: &cfg.User, NetworkAllowlist: cfg.NetworkAllowlist,
		Workspace: cfg.Workspace, FromSnapshot: cfg.FromSnapshot,
	}
	for _, m := range cfg.Mounts {
		pb.Mounts = append(pb.Mounts, &rochev1.Mount{Source: m.Source, Target: m.Target, ReadWrite: m.ReadWrite})
	}
	return pb
}

// clampInt32 keeps an out-of-range int out-of-range (and so refused by Validate)
// instead of wrapping it into a valid-looking number.
func clampInt32(n int) int32 {
	const maxInt32, minInt32 = 1<<31 - 1, -1 << 31
	return int32(max(min(n, maxInt32), minInt32))
}

func stateFromProto(s rochev1.SandboxState) roche.SandboxState {
	switch s {
	case rochev1.SandboxState_SANDBOX_STATE_RUNNING:
		return roche.StateRunning
	case rochev1.SandboxState_SANDBOX_STATE_PAUSED:
		return roche.StatePaused
	case rochev1.SandboxState_SANDBOX_STATE_CREATED:
		return roche.StateCreated
	}
	return roche.StateExited
}

func infoFromProto(pb *rochev1.Sandbox) roche.SandboxInfo {
	if pb == nil {
		return roche.SandboxInfo{}
	}
	return roche.SandboxInfo{
		ID: pb.Id, Provider: pb.Provider, Image: pb.Image, State: stateFromProto(pb.State),
		CreatedAt: timeFromProto(pb.CreatedAt), ExpiresAt: timeFromProto(pb.ExpiresAt),
	}
}

// timeFromProto is the zero time for a missing timestamp (AsTime would give 1970).
func timeFromProto(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime().Local()
}

func resultFromProto(pb *rochev1.ExecResult) roche.ExecResult {
	if pb == nil {
		return roche.ExecResult{ExitCode: -1}
	}
	var d time.Duration
	if pb.Duration != nil {
		d = pb.Duration.AsDuration()
	}
	return roche.ExecResult{
		ExitCode: int(pb.ExitCode), Stdout: string(pb.Stdout), Stderr: string(pb.Stderr),
		TimedOut: pb.TimedOut, Truncated: pb.Truncated, OOMKilled: pb.OomKilled, Duration: d,
	}
}

func ptr[T any](v T) *T { return &v }

func workspaceFromProto(pb *rochev1.Workspace) roche.Workspace {
	return roche.Workspace{Name: pb.Name, Provider: pb.Provider, CreatedAt: timeFromProto(pb.CreatedAt), InUseBy: pb.InUseBy}
}

func snapshotFromProto(pb *rochev1.Snapshot) roche.Snapshot {
	return roche.Snapshot{Name: pb.Name, Provider: pb.Provider, Image: pb.Image, CreatedAt: timeFromProto(pb.CreatedAt)}
}
