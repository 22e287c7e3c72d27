// Package wire converts between the core's types (package roche) and the API's messages
// (roche.v1, package rochev1), both directions of every type side by side, so that a
// field added to one side is added to the other in one place. roched's handlers and the
// Go client both convert through it; wire_test.go fails when a field exists on one side
// only. Errors cross the wire here too (errors.go): ToStatus on the daemon's way out,
// FromStatus on the client's way in.
package wire

import (
	"bytes"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/pool"
)

// ConfigToProto sends every field explicitly, so the daemon's defaults for fields left
// out never replace what the caller asked for (a zero cpus is refused, not defaulted).
// leased asks for a sandbox tied to the caller's Hold stream (kit.CreateOptions.Leased);
// the owner is never sent, roched names it.
func ConfigToProto(cfg roche.Config, leased bool) *rochev1.SandboxConfig {
	pb := &rochev1.SandboxConfig{
		Image: &cfg.Image, Network: cfg.Network, Writable: cfg.Writable, TimeoutSecs: ptr(clampInt32(cfg.TimeoutSecs)),
		Memory: &cfg.Memory, Cpus: &cfg.CPUs, PidsLimit: ptr(clampInt32(cfg.PidsLimit)), Env: cfg.Env,
		Workdir: cfg.Workdir, User: &cfg.User, NetworkAllowlist: cfg.NetworkAllowlist,
		Workspace: cfg.Workspace, FromSnapshot: cfg.FromSnapshot, Disk: &cfg.Disk, WorkspaceSize: cfg.WorkspaceSize,
		Leased: leased, Metadata: cfg.Metadata, EgressLearn: cfg.EgressLearn,
	}
	for _, m := range cfg.Mounts {
		pb.Mounts = append(pb.Mounts, &rochev1.Mount{Source: m.Source, Target: m.Target, ReadWrite: m.ReadWrite})
	}
	for _, s := range cfg.Secrets {
		pb.Secrets = append(pb.Secrets, &rochev1.Secret{Name: s.Name, Value: s.Value, Hosts: s.Hosts, Header: s.Header, FromStore: s.FromStore})
	}
	return pb
}

// ConfigFromProto fills a roche.Config, fields left out taking the secure defaults, and
// says whether the caller asked for a leased sandbox.
func ConfigFromProto(pb *rochev1.SandboxConfig) (cfg roche.Config, leased bool) {
	cfg = roche.DefaultConfig()
	if pb == nil {
		return cfg, false
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
	if pb.Disk != nil {
		cfg.Disk = *pb.Disk
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
	if len(pb.Metadata) > 0 {
		cfg.Metadata = pb.Metadata
	}
	for _, m := range pb.Mounts {
		cfg.Mounts = append(cfg.Mounts, roche.Mount{Source: m.Source, Target: m.Target, ReadWrite: m.ReadWrite})
	}
	for _, s := range pb.Secrets {
		cfg.Secrets = append(cfg.Secrets, roche.Secret{Name: s.Name, Value: s.Value, Hosts: s.Hosts, Header: s.Header, FromStore: s.FromStore})
	}
	cfg.Workdir = pb.Workdir
	cfg.NetworkAllowlist = pb.NetworkAllowlist
	cfg.Workspace = pb.Workspace
	cfg.FromSnapshot = pb.FromSnapshot
	cfg.WorkspaceSize = pb.WorkspaceSize
	cfg.EgressLearn = pb.EgressLearn
	return cfg, pb.Leased
}

// clampInt32 keeps an out-of-range int out-of-range (and so refused by Validate)
// instead of wrapping it into a valid-looking number.
func clampInt32(n int) int32 {
	const maxInt32, minInt32 = 1<<31 - 1, -1 << 31
	return int32(max(min(n, maxInt32), minInt32))
}

func ptr[T any](v T) *T { return &v }

// ExecParams is what ExecRequest and ExecStreamRequest share.
type ExecParams interface {
	GetSandboxId() string
	GetCmd() []string
	GetEnv() map[string]string
	GetWorkdir() string
	GetTimeoutSecs() float64
	GetStdin() []byte
	GetOutputLimit() int64
	GetIdempotencyKey() string
}

var (
	_ ExecParams = (*rochev1.ExecRequest)(nil)
	_ ExecParams = (*rochev1.ExecStreamRequest)(nil)
)

// ExecToProto is the request to run req in the sandbox id. stdin is the command's whole
// input, nil for none (the message cannot carry a reader); Stdout and Stderr stay with
// the caller, who receives the output.
func ExecToProto(id string, req roche.ExecRequest, stdin []byte) *rochev1.ExecRequest {
	return &rochev1.ExecRequest{
		SandboxId: id, Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir,
		TimeoutSecs: req.Timeout.Seconds(), Stdin: stdin, OutputLimit: req.OutputLimit,
		IdempotencyKey: req.IdempotencyKey,
	}
}

// ExecStreamToProto is ExecToProto for ExecStream.
func ExecStreamToProto(id string, req roche.ExecRequest, stdin []byte) *rochev1.ExecStreamRequest {
	pb := ExecToProto(id, req, stdin)
	return &rochev1.ExecStreamRequest{
		SandboxId: pb.SandboxId, Cmd: pb.Cmd, Env: pb.Env, Workdir: pb.Workdir,
		TimeoutSecs: pb.TimeoutSecs, Stdin: pb.Stdin, OutputLimit: pb.OutputLimit,
		IdempotencyKey: pb.IdempotencyKey,
	}
}

// MaxExecOutput is the most output per stream a unary Exec may ask for (output_limit):
// its result carries the output whole, so the daemon holds it until it is sent.
// ExecStream streams up to roche.MaxOutputLimit and holds none.
const MaxExecOutput = 16 << 20

// MaxUploadBytes bounds one CopyTo upload (roche cp into a sandbox through roched, the Go
// client's WriteFile): the daemon unpacks it on its own disk before copying it in.
const MaxUploadBytes = 1 << 30

// ExecFromProto is the command an Exec or ExecStream asks for, refusing what cannot be
// converted: a timeout_secs no Duration holds, stdin over roche.MaxStdinBytes (a message
// carries it whole). The caller validates the request (roche.ExecRequest.Validate). A message that carries stdin (even empty) gives the command that
// input; one without gives it none.
func ExecFromProto(pb ExecParams) (roche.ExecRequest, error) {
	timeout, err := ExecTimeout(pb.GetTimeoutSecs())
	if err != nil {
		return roche.ExecRequest{}, err
	}
	if n := len(pb.GetStdin()); n > roche.MaxStdinBytes {
		return roche.ExecRequest{}, fmt.Errorf("%w: stdin is %d bytes, over the limit of %s: copy large input in as a file (roche cp) instead",
			roche.ErrInvalidConfig, n, size.String(roche.MaxStdinBytes))
	}
	req := roche.ExecRequest{
		Cmd:            pb.GetCmd(),
		Env:            pb.GetEnv(),
		Workdir:        pb.GetWorkdir(),
		Timeout:        timeout,
		OutputLimit:    pb.GetOutputLimit(),
		IdempotencyKey: pb.GetIdempotencyKey(),
	}
	if pb.GetStdin() != nil {
		req.Stdin = bytes.NewReader(pb.GetStdin())
	}
	return req, nil
}

// CheckExecOutput refuses a unary Exec whose output_limit is over MaxExecOutput.
func CheckExecOutput(req roche.ExecRequest) error {
	if req.OutputLimit > MaxExecOutput {
		return fmt.Errorf("%w: output_limit %d is over the limit of %s per stream for Exec, whose result carries the output whole: use ExecStream (up to %s)",
			roche.ErrInvalidConfig, req.OutputLimit, size.String(MaxExecOutput), size.String(roche.MaxOutputLimit))
	}
	return nil
}

// StateToProto maps a sandbox state onto the API's enum.
func StateToProto(s roche.SandboxState) rochev1.SandboxState {
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

// StateFromProto is StateToProto's inverse; an unknown state reads as exited.
func StateFromProto(s rochev1.SandboxState) roche.SandboxState {
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

// timeToProto leaves a zero time out rather than sending 0001-01-01.
func timeToProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// timeFromProto is the zero time for a missing timestamp (AsTime would give 1970).
func timeFromProto(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime().Local()
}

// InfoToProto describes a sandbox on the wire.
func InfoToProto(sb roche.SandboxInfo) *rochev1.Sandbox {
	return &rochev1.Sandbox{
		Id: sb.ID, Provider: sb.Provider, Image: sb.Image, State: StateToProto(sb.State),
		CreatedAt: timeToProto(sb.CreatedAt), ExpiresAt: timeToProto(sb.ExpiresAt), Transport: sb.Transport,
		Owner: sb.Owner, Metadata: sb.Metadata, End: EndToProto(sb.End),
	}
}

// InfoFromProto is InfoToProto's inverse.
func InfoFromProto(pb *rochev1.Sandbox) roche.SandboxInfo {
	if pb == nil {
		return roche.SandboxInfo{}
	}
	return roche.SandboxInfo{
		ID: pb.Id, Provider: pb.Provider, Image: pb.Image, State: StateFromProto(pb.State),
		CreatedAt: timeFromProto(pb.CreatedAt), ExpiresAt: timeFromProto(pb.ExpiresAt), Transport: pb.Transport,
		Owner: pb.Owner, Metadata: pb.Metadata, End: EndFromProto(pb.End),
	}
}

// FilterToProto is the list request for provider ("" for all) with filter f.
func FilterToProto(provider string, f roche.ListFilter) *rochev1.ListRequest {
	pb := &rochev1.ListRequest{Provider: provider, Metadata: f.Metadata}
	if f.State != "" {
		pb.State = StateToProto(f.State)
	}
	return pb
}

// FilterFromProto is FilterToProto's inverse.
func FilterFromProto(pb *rochev1.ListRequest) roche.ListFilter {
	f := roche.ListFilter{Metadata: pb.Metadata}
	if pb.State != rochev1.SandboxState_SANDBOX_STATE_UNSPECIFIED {
		f.State = StateFromProto(pb.State)
	}
	return f
}

// ResultToProto is a command's result; withOutput carries stdout and stderr in it (Exec),
// without them they went ahead as chunks (ExecStream).
func ResultToProto(r roche.ExecResult, withOutput bool) *rochev1.ExecResult {
	pb := &rochev1.ExecResult{
		ExitCode: int32(r.ExitCode), TimedOut: r.TimedOut, Truncated: r.Truncated,
		OomKilled: r.OOMKilled, Duration: durationpb.New(r.Duration), Receipt: ReceiptToProto(r.Receipt),
	}
	if withOutput {
		pb.Stdout, pb.Stderr = []byte(r.Stdout), []byte(r.Stderr)
	}
	return pb
}

// ResultFromProto is ResultToProto's inverse; a missing result reads as exit -1.
func ResultFromProto(pb *rochev1.ExecResult) roche.ExecResult {
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
		Receipt: ReceiptFromProto(pb.Receipt),
	}
}

// CapsToProto says what a provider supports.
func CapsToProto(c roche.Capabilities) *rochev1.Capabilities {
	return &rochev1.Capabilities{
		Network: c.Network, Egress: c.Egress, Writable: c.Writable, Mounts: c.Mounts, Files: c.Files,
		Pause: c.Pause, Stdin: c.Stdin, Processes: c.Processes, NotApplicable: c.NotApplicable, Leases: c.Leases,
		Code: c.Code, RichResults: c.RichResults,
	}
}

// CapsFromProto is CapsToProto's inverse; missing capabilities support nothing.
func CapsFromProto(pb *rochev1.Capabilities) roche.Capabilities {
	if pb == nil {
		return roche.Capabilities{}
	}
	return roche.Capabilities{
		Network: pb.Network, Egress: pb.Egress, Writable: pb.Writable, Mounts: pb.Mounts, Files: pb.Files,
		Pause: pb.Pause, Stdin: pb.Stdin, Processes: pb.Processes, NotApplicable: pb.NotApplicable, Leases: pb.Leases,
		Code: pb.Code, RichResults: pb.RichResults,
	}
}

// WorkspaceToProto describes a workspace.
func WorkspaceToProto(w roche.Workspace) *rochev1.Workspace {
	return &rochev1.Workspace{Name: w.Name, Provider: w.Provider, CreatedAt: timeToProto(w.CreatedAt), InUseBy: w.InUseBy, SizeBytes: w.SizeBytes}
}

// WorkspaceFromProto is WorkspaceToProto's inverse.
func WorkspaceFromProto(pb *rochev1.Workspace) roche.Workspace {
	return roche.Workspace{Name: pb.GetName(), Provider: pb.GetProvider(), CreatedAt: timeFromProto(pb.GetCreatedAt()), InUseBy: pb.GetInUseBy(), SizeBytes: pb.GetSizeBytes()}
}

// SnapshotToProto describes a snapshot.
func SnapshotToProto(s roche.Snapshot) *rochev1.Snapshot {
	return &rochev1.Snapshot{Name: s.Name, Provider: s.Provider, Image: s.Image, CreatedAt: timeToProto(s.CreatedAt)}
}

// SnapshotFromProto is SnapshotToProto's inverse.
func SnapshotFromProto(pb *rochev1.Snapshot) roche.Snapshot {
	return roche.Snapshot{Name: pb.GetName(), Provider: pb.GetProvider(), Image: pb.GetImage(), CreatedAt: timeFromProto(pb.GetCreatedAt())}
}

// PoolToProto reports a warm pool. Clients read the message as it is (roche pool status
// prints it), so it has no inverse.
func PoolToProto(st pool.Status) *rochev1.Pool {
	s := st.Spec
	pb := &rochev1.Pool{
		Key: s.Key.String(), Provider: s.Provider, Image: s.Image,
		MinIdle: int32(s.MinIdle), MaxIdle: int32(s.MaxIdle), MaxTotal: int32(s.MaxTotal),
		IdleTimeout: durationpb.New(s.IdleTimeout), MaxTimeoutSecs: int32(s.MaxTimeoutSecs),
		Idle: int32(st.Idle), Creating: int32(st.Creating), InUse: int32(st.InUse),
		Hits: st.Hits, Misses: st.Misses, Drained: st.Drained, Spec: s.String(),
		MaxQueue: int32(s.MaxQueue), Waiting: int32(st.Waiting), Target: int32(st.Target),
	}
	if st.LastErr != nil {
		pb.LastError = st.LastErr.Error()
	}
	return pb
}
