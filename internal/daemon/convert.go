package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/pool"
)

// rpcError turns a core error into an RPC error with the matching code, keeping the
// core's message, and attaches an ErrorDetail naming the sentinel so that clients can
// recover it exactly. This is the only place core errors meet RPC codes.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	code, reason := connect.CodeInternal, rochev1.ErrorReason_ERROR_REASON_UNSPECIFIED
	switch {
	case errors.Is(err, roche.ErrExhausted):
		code, reason = connect.CodeResourceExhausted, rochev1.ErrorReason_ERROR_REASON_EXHAUSTED
	case errors.Is(err, roche.ErrInvalidConfig):
		code, reason = connect.CodeInvalidArgument, rochev1.ErrorReason_ERROR_REASON_INVALID_CONFIG
	case errors.Is(err, roche.ErrImageNotFound):
		// The request is fine; the host lacks the image until someone builds or pulls it.
		code, reason = connect.CodeFailedPrecondition, rochev1.ErrorReason_ERROR_REASON_IMAGE_NOT_FOUND
	case errors.Is(err, roche.ErrNotFound):
		code, reason = connect.CodeNotFound, rochev1.ErrorReason_ERROR_REASON_NOT_FOUND
	case errors.Is(err, roche.ErrInUse):
		code, reason = connect.CodeFailedPrecondition, rochev1.ErrorReason_ERROR_REASON_IN_USE
	case errors.Is(err, roche.ErrPermission):
		code, reason = connect.CodePermissionDenied, rochev1.ErrorReason_ERROR_REASON_PERMISSION
	case errors.Is(err, roche.ErrUnsupported):
		code, reason = connect.CodeUnimplemented, rochev1.ErrorReason_ERROR_REASON_UNSUPPORTED
	case errors.Is(err, roche.ErrUnavailable):
		code, reason = connect.CodeUnavailable, rochev1.ErrorReason_ERROR_REASON_UNAVAILABLE
	case errors.Is(err, roche.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		code, reason = connect.CodeDeadlineExceeded, rochev1.ErrorReason_ERROR_REASON_TIMEOUT
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	e := connect.NewError(code, err)
	if reason != rochev1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		if d, derr := connect.NewErrorDetail(&rochev1.ErrorDetail{Reason: reason}); derr == nil {
			e.AddDetail(d)
		}
	}
	return e
}

// configFromProto fills a roche.Config, fields left out taking the secure defaults.
func configFromProto(pb *rochev1.SandboxConfig) roche.Config {
	cfg := roche.DefaultConfig()
	if pb == nil {
		return cfg
	}
	if pb.Image != nil {
		cfg.Image = *pb.Image
	}
	cfg.Network = pb.Network
	cfg.Writable = pb.Writable
	if pb.TimeoutSecs != nil {
		cfg.TimeoutSecs = int(*pb.TimeoutSecs)
	}
	if pb.Memory != nil {
		cfg.Memory = *pb.Memory
	}
	if pb.Cpus != nil {
		cfg.CPUs = *pb.Cpus
	}
	if pb.PidsLimit != nil {
		cfg.PidsLimit = int(*pb.PidsLimit)
	}
	if pb.User != nil {
		cfg.User = *pb.User
	}
	if len(pb.Env) > 0 {
		cfg.Env = pb.Env
	}
	for _, m := range pb.Mounts {
		cfg.Mounts = append(cfg.Mounts, roche.Mount{Source: m.Source, Target: m.Target, ReadWrite: m.ReadWrite})
	}
	cfg.Workdir = pb.Workdir
	cfg.NetworkAllowlist = pb.NetworkAllowlist
	cfg.Workspace = pb.Workspace
	cfg.FromSnapshot = pb.FromSnapshot
	return cfg
}

// execParams is what ExecRequest and ExecStreamRequest share.
type execParams interface {
	GetSandboxId() string
	GetCmd() []string
	GetEnv() map[string]string
	GetWorkdir() string
	GetTimeoutSecs() float64
	GetStdin() []byte
	GetOutputLimit() int64
}

func execFromProto(pb execParams, hasStdin bool) (roche.ExecRequest, error) {
	secs := pb.GetTimeoutSecs()
	if secs < 0 || math.IsNaN(secs) || math.IsInf(secs, 0) || secs > 1e9 {
		return roche.ExecRequest{}, fmt.Errorf("%w: timeout_secs %v: give seconds > 0, or 0 for the sandbox's lifetime", roche.ErrInvalidConfig, secs)
	}
	if pb.GetOutputLimit() < 0 {
		return roche.ExecRequest{}, fmt.Errorf("%w: output_limit %d is negative", roche.ErrInvalidConfig, pb.GetOutputLimit())
	}
	req := roche.ExecRequest{
		Cmd:         pb.GetCmd(),
		Env:         pb.GetEnv(),
		Workdir:     pb.GetWorkdir(),
		Timeout:     time.Duration(secs * float64(time.Second)),
		OutputLimit: pb.GetOutputLimit(),
	}
	if hasStdin {
		req.Stdin = bytes.NewReader(pb.GetStdin())
	}
	return req, nil
}

func stateToProto(s roche.SandboxState) rochev1.SandboxState {
	switch s {
	case roche.StateRunning:
		return rochev1.SandboxState_SANDBOX_STATE_RUNNING
	case roche.StatePaused:
		return rochev1.SandboxState_SANDBOX_STATE_PAUSED
	case roche.StateExited:
		return rochev1.SandboxState_SANDBOX_STATE_EXITED
	case roche.StateCreated:
		return rochev1.SandboxState_SANDBOX_STATE_CREATED
	}
	return rochev1.SandboxState_SANDBOX_STATE_UNSPECIFIED
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func infoToProto(sb roche.SandboxInfo) *rochev1.Sandbox {
	return &rochev1.Sandbox{
		Id: sb.ID, Provider: sb.Provider, Image: sb.Image, State: stateToProto(sb.State),
		CreatedAt: timestamp(sb.CreatedAt), ExpiresAt: timestamp(sb.ExpiresAt),
	}
}

func resultToProto(r roche.ExecResult, withOutput bool) *rochev1.ExecResult {
	pb := &rochev1.ExecResult{
		ExitCode: int32(r.ExitCode), TimedOut: r.TimedOut, Truncated: r.Truncated,
		OomKilled: r.OOMKilled, Duration: durationpb.New(r.Duration),
	}
	if withOutput {
		pb.Stdout, pb.Stderr = []byte(r.Stdout), []byte(r.Stderr)
	}
	return pb
}

func capsToProto(c roche.Capabilities) *rochev1.Capabilities {
	return &rochev1.Capabilities{
		Network: c.Network, Writable: c.Writable, Mounts: c.Mounts, Files: c.Files, Pause: c.Pause,
		Stdin: c.Stdin, Processes: c.Processes, NotApplicable: c.NotApplicable,
	}
}

func poolToProto(st pool.Status) *rochev1.Pool {
	s := st.Spec
	pb := &rochev1.Pool{
		Key: s.Key.String(), Provider: s.Provider, Image: s.Image,
		MinIdle: int32(s.MinIdle), MaxIdle: int32(s.MaxIdle), MaxTotal: int32(s.MaxTotal),
		IdleTimeout: durationpb.New(s.IdleTimeout), MaxTimeoutSecs: int32(s.MaxTimeoutSecs),
		Idle: int32(st.Idle), Creating: int32(st.Creating), InUse: int32(st.InUse),
		Hits: st.Hits, Misses: st.Misses, Drained: st.Drained, Spec: s.String(),
	}
	if st.LastErr != nil {
		pb.LastError = st.LastErr.Error()
	}
	return pb
}

func workspaceToProto(w roche.Workspace) *rochev1.Workspace {
	return &rochev1.Workspace{Name: w.Name, Provider: w.Provider, CreatedAt: timestamp(w.CreatedAt), InUseBy: w.InUseBy}
}

func snapshotToProto(s roche.Snapshot) *rochev1.Snapshot {
	return &rochev1.Snapshot{Name: s.Name, Provider: s.Provider, Image: s.Image, CreatedAt: timestamp(s.CreatedAt)}
}
