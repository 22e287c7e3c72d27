package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/kit"
)

// service implements the API on top of the ledger: each method finds the caller's tenant,
// calls the ledger with what the request means in roche's types, and converts the answer
// (internal/wire); every error leaves through wire.ToStatus.
type service struct {
	rochev1connect.UnimplementedSandboxServiceHandler
	d *Daemon
}

var _ rochev1connect.SandboxServiceHandler = (*service)(nil)

func (s *service) Create(ctx context.Context, req *connect.Request[rochev1.CreateRequest]) (*connect.Response[rochev1.CreateResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	cfg, leased := wire.ConfigFromProto(req.Msg.Config)
	err = s.d.prepareEgress(t.Name, &cfg) // egress.go
	var sb roche.SandboxInfo
	var pooled bool
	if err == nil {
		sb, pooled, err = s.d.ledger.CreateKeyed(ctx, t, req.Msg.Provider, cfg, leased, req.Msg.IdempotencyKey)
	}
	if err == nil {
		s.d.startedEgress(t.Name, sb.ID, cfg)
	}
	s.d.audit(ctx, "create", err, "id", sb.ID, "provider", req.Msg.Provider, "image", cfg.Image, "user", cfg.User,
		"mounts", mountStrings(cfg.Mounts), "workspace", cfg.Workspace, "pooled", pooled)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.CreateResponse{Sandbox: wire.InfoToProto(sb), Pooled: pooled}), nil
}

func mountStrings(ms []roche.Mount) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.String()
	}
	return out
}

func (s *service) Exec(ctx context.Context, req *connect.Request[rochev1.ExecRequest]) (*connect.Response[rochev1.ExecResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	r, err := wire.ExecFromProto(req.Msg)
	if err == nil {
		err = wire.CheckExecOutput(r)
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	// The output is held here, within the daemon's budget, and nowhere else.
	stdout, stderr, done := s.d.newHeldOutputs(ctx)
	defer done()
	r.Stdout, r.Stderr, r.StreamOnly = stdout, stderr, true
	res, err := s.d.ledger.Exec(ctx, t, req.Msg.SandboxId, r)
	s.d.audit(ctx, "exec", err, "id", req.Msg.SandboxId, "argv", r.Cmd, "exit_code", res.ExitCode)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	pb := wire.ResultToProto(res, false)
	pb.Stdout, pb.Stderr = stdout.buf, stderr.buf
	pb.Truncated = pb.Truncated || stdout.short || stderr.short
	return connect.NewResponse(&rochev1.ExecResponse{Result: pb}), nil
}

// streamSender serialises sends on one stream: the provider writes stdout and stderr
// from its own goroutines and the heartbeat ticks from another.
type streamSender[T any] struct {
	mu     sync.Mutex
	stream *connect.ServerStream[T]
	last   time.Time
	closed bool
}

func newSender[T any](stream *connect.ServerStream[T]) *streamSender[T] {
	return &streamSender[T]{stream: stream, last: time.Now()}
}

func (s *streamSender[T]) send(msg *T) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("stream closed")
	}
	s.last = time.Now()
	return s.stream.Send(msg)
}

// close stops further sends; the handler must not send after it returns.
func (s *streamSender[T]) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// heartbeats sends beat(now) whenever the stream has been quiet for every, until the
// returned stop is called.
func (s *streamSender[T]) heartbeats(every time.Duration, beat func(time.Time) *T) (stop func()) {
	done := make(chan struct{})
	var beats sync.WaitGroup
	beats.Add(1)
	go func() {
		defer beats.Done()
		t := time.NewTicker(every / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				s.mu.Lock()
				quiet := now.Sub(s.last) >= every
				s.mu.Unlock()
				if quiet {
					_ = s.send(beat(now))
				}
			}
		}
	}()
	return func() {
		close(done)
		beats.Wait()
	}
}

// chunkWriter sends what a command writes as output chunks, wrapped by msg.
type chunkWriter[T any] struct {
	s      *streamSender[T]
	stream rochev1.OutputStream
	msg    func(*rochev1.OutputChunk) *T
}

// maxChunk keeps each message small enough to flow smoothly through proxies.
const maxChunk = 32 << 10

func (w chunkWriter[T]) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		c := p[:min(len(p), maxChunk)]
		p = p[len(c):]
		if err := w.s.send(w.msg(&rochev1.OutputChunk{Stream: w.stream, Data: c})); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func execChunk(c *rochev1.OutputChunk) *rochev1.ExecStreamResponse {
	return &rochev1.ExecStreamResponse{Event: &rochev1.ExecStreamResponse_Output{Output: c}}
}

func (s *service) ExecStream(ctx context.Context, req *connect.Request[rochev1.ExecStreamRequest], stream *connect.ServerStream[rochev1.ExecStreamResponse]) error {
	t, err := tenantOf(ctx)
	if err != nil {
		return wire.ToStatus(err)
	}
	r, err := wire.ExecFromProto(req.Msg)
	if err != nil {
		return wire.ToStatus(err)
	}
	sender := newSender(stream)
	r.Stdout = chunkWriter[rochev1.ExecStreamResponse]{sender, rochev1.OutputStream_OUTPUT_STREAM_STDOUT, execChunk}
	r.Stderr = chunkWriter[rochev1.ExecStreamResponse]{sender, rochev1.OutputStream_OUTPUT_STREAM_STDERR, execChunk}
	// Passed on as it comes; the daemon keeps no copy, whatever the output limit.
	r.StreamOnly = true

	// Heartbeats while the command is quiet.
	stop := sender.heartbeats(s.d.cfg.HeartbeatInterval, func(now time.Time) *rochev1.ExecStreamResponse {
		return &rochev1.ExecStreamResponse{Event: &rochev1.ExecStreamResponse_Heartbeat{
			Heartbeat: &rochev1.Heartbeat{Time: timestamppb.New(now)},
		}}
	})
	res, err := s.d.ledger.Exec(ctx, t, req.Msg.SandboxId, r)
	stop()
	s.d.audit(ctx, "exec", err, "id", req.Msg.SandboxId, "argv", r.Cmd, "exit_code", res.ExitCode, "stream", true)
	if err != nil {
		sender.close()
		return wire.ToStatus(err)
	}
	err = sender.send(&rochev1.ExecStreamResponse{Event: &rochev1.ExecStreamResponse_Result{Result: wire.ResultToProto(res, false)}})
	sender.close()
	return err
}

func (s *service) Destroy(ctx context.Context, req *connect.Request[rochev1.DestroyRequest]) (*connect.Response[rochev1.DestroyResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	ids := req.Msg.Ids
	if req.Msg.All == (len(ids) > 0) {
		return nil, wire.ToStatus(fmt.Errorf("%w: give sandbox ids or all, not both or neither", roche.ErrInvalidConfig))
	}
	var skipped []*rochev1.SkippedProvider
	if req.Msg.All {
		list, err := s.d.ledger.List(ctx, t, req.Msg.Provider)
		if skipped = wire.SkippedToProto(err); skipped == nil && err != nil {
			return nil, wire.ToStatus(err)
		}
		// A pool sandbox removed behind the pool's back meanwhile must not be handed out.
		defer s.d.ledger.VerifyIdleSoon()
		ids = ids[:0]
		for _, sb := range list {
			ids = append(ids, sb.ID)
		}
	}
	resp := &rochev1.DestroyResponse{Skipped: skipped}
	var errs []error
	for _, id := range ids {
		full, err := s.d.ledger.Destroy(t, id)
		s.d.audit(ctx, "destroy", err, "id", id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		resp.Destroyed = append(resp.Destroyed, full)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(resp), nil
}

func (s *service) List(ctx context.Context, req *connect.Request[rochev1.ListRequest]) (*connect.Response[rochev1.ListResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	filter := wire.FilterFromProto(req.Msg)
	if err := filter.Validate(); err != nil {
		return nil, wire.ToStatus(err)
	}
	list, err := s.d.ledger.List(ctx, t, req.Msg.Provider)
	skipped := wire.SkippedToProto(err)
	if skipped == nil && err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.ListResponse{Skipped: skipped}
	for _, sb := range filter.Filter(list) {
		resp.Sandboxes = append(resp.Sandboxes, wire.InfoToProto(sb))
	}
	return connect.NewResponse(resp), nil
}

func (s *service) Inspect(ctx context.Context, req *connect.Request[rochev1.InspectRequest]) (*connect.Response[rochev1.InspectResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	sb, err := s.d.ledger.Inspect(ctx, t, req.Msg.SandboxId)
	if errors.Is(err, roche.ErrNotFound) && req.Msg.IncludeEnded {
		// Ended within the retention: its last description, with why it ended.
		if ended, ok := s.d.ledger.InspectEnded(t, req.Msg.SandboxId); ok {
			sb, err = ended, nil
		}
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.InspectResponse{Sandbox: wire.InfoToProto(sb)}), nil
}

func (s *service) SetTimeout(ctx context.Context, req *connect.Request[rochev1.SetTimeoutRequest]) (*connect.Response[rochev1.SetTimeoutResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	sb, err := s.d.ledger.SetTimeout(ctx, t, req.Msg.SandboxId, time.Duration(req.Msg.TimeoutSecs)*time.Second)
	s.d.audit(ctx, "set_timeout", err, "id", req.Msg.SandboxId, "timeout_secs", req.Msg.TimeoutSecs)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.SetTimeoutResponse{Sandbox: wire.InfoToProto(sb)}), nil
}

// pause pauses or unpauses a sandbox of the caller's.
func (s *service) pause(ctx context.Context, id string, pause bool) error {
	t, err := tenantOf(ctx)
	if err != nil {
		return err
	}
	return s.d.ledger.Pause(ctx, t, id, pause)
}

func (s *service) Pause(ctx context.Context, req *connect.Request[rochev1.PauseRequest]) (*connect.Response[rochev1.PauseResponse], error) {
	if req.Msg.ToDisk {
		t, err := tenantOf(ctx)
		if err == nil {
			err = s.d.ledger.PauseToDisk(ctx, t, req.Msg.SandboxId)
			s.d.audit(ctx, "pause_to_disk", err, "id", req.Msg.SandboxId)
		}
		if err != nil {
			return nil, wire.ToStatus(err)
		}
		return connect.NewResponse(&rochev1.PauseResponse{}), nil
	}
	if err := s.pause(ctx, req.Msg.SandboxId, true); err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.PauseResponse{}), nil
}

func (s *service) Unpause(ctx context.Context, req *connect.Request[rochev1.UnpauseRequest]) (*connect.Response[rochev1.UnpauseResponse], error) {
	if err := s.pause(ctx, req.Msg.SandboxId, false); err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.UnpauseResponse{}), nil
}

func (s *service) Resume(ctx context.Context, req *connect.Request[rochev1.ResumeRequest]) (*connect.Response[rochev1.ResumeResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	sb, err := s.d.ledger.Resume(ctx, t, req.Msg.SandboxId)
	s.d.audit(ctx, "resume", err, "id", req.Msg.SandboxId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.ResumeResponse{Sandbox: wire.InfoToProto(sb)}), nil
}

func (s *service) Fork(ctx context.Context, req *connect.Request[rochev1.ForkRequest]) (*connect.Response[rochev1.ForkResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	values := s.d.secretValues(t, req.Msg.SandboxId)
	forks, err := s.d.ledger.Fork(ctx, t, req.Msg.SandboxId, int(req.Msg.Count))
	ids := make([]string, len(forks))
	for i, sb := range forks {
		ids[i] = sb.ID
	}
	s.d.remadeEgress(t.Name, values, ids...)
	s.d.audit(ctx, "fork", err, "id", req.Msg.SandboxId, "count", req.Msg.Count, "forks", ids)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.ForkResponse{}
	for _, sb := range forks {
		resp.Sandboxes = append(resp.Sandboxes, wire.InfoToProto(sb))
	}
	return connect.NewResponse(resp), nil
}

// Gc removes client sandboxes past the expiry the daemon enforces (or the provider's,
// for those it does not track) and stopped ones; every one with all. Idle pooled
// sandboxes are the pools' to manage and are left alone.
func (s *service) Gc(ctx context.Context, req *connect.Request[rochev1.GcRequest]) (*connect.Response[rochev1.GcResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	list, err := s.d.ledger.List(ctx, t, req.Msg.Provider)
	skipped := wire.SkippedToProto(err)
	if skipped == nil && err != nil {
		return nil, wire.ToStatus(err)
	}
	if !req.Msg.DryRun {
		defer s.d.ledger.VerifyIdleSoon()
	}
	removed, err := kit.Collect(ctx, list, roche.GCOptions{All: req.Msg.All, DryRun: req.Msg.DryRun}, func(_ context.Context, id string) error {
		_, err := s.d.ledger.Destroy(t, id)
		s.d.audit(ctx, "destroy", err, "id", id, "by", "gc")
		return err
	})
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.GcResponse{Skipped: skipped}
	for _, sb := range removed {
		resp.Removed = append(resp.Removed, wire.InfoToProto(sb))
	}
	return connect.NewResponse(resp), nil
}

func poolsToProto(ps []*pool.Pool) []*rochev1.Pool {
	out := make([]*rochev1.Pool, 0, len(ps))
	for _, p := range ps {
		out = append(out, wire.PoolToProto(p.Status()))
	}
	return out
}

func (s *service) PoolStatus(_ context.Context, _ *connect.Request[rochev1.PoolStatusRequest]) (*connect.Response[rochev1.PoolStatusResponse], error) {
	return connect.NewResponse(&rochev1.PoolStatusResponse{Pools: poolsToProto(s.d.ledger.Pools())}), nil
}

// operatorOnly refuses pool management to TCP tenants: the pools serve every tenant,
// and draining them is the operator's decision.
func operatorOnly(ctx context.Context, what string) error {
	t, err := tenantOf(ctx)
	if err == nil && !t.Local {
		err = fmt.Errorf("%w: %s is for roched's operator, on its unix socket", roche.ErrPermission, what)
	}
	return err
}

func (s *service) PoolWarmup(ctx context.Context, req *connect.Request[rochev1.PoolWarmupRequest]) (*connect.Response[rochev1.PoolWarmupResponse], error) {
	if err := operatorOnly(ctx, "warming pools up"); err != nil {
		return nil, wire.ToStatus(err)
	}
	ps, err := s.d.ledger.SelectPools(req.Msg.Key)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ps))
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Warmup(ctx, int(req.Msg.Count))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.PoolWarmupResponse{Pools: poolsToProto(ps)}), nil
}

func (s *service) PoolDrain(ctx context.Context, req *connect.Request[rochev1.PoolDrainRequest]) (*connect.Response[rochev1.PoolDrainResponse], error) {
	if err := operatorOnly(ctx, "draining pools"); err != nil {
		return nil, wire.ToStatus(err)
	}
	ps, err := s.d.ledger.SelectPools(req.Msg.Key)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.PoolDrainResponse{}
	var errs []error
	for _, p := range ps {
		n, err := p.Drain(ctx)
		resp.Destroyed += int32(n)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, wire.ToStatus(err)
	}
	resp.Pools = poolsToProto(ps)
	return connect.NewResponse(resp), nil
}

func (s *service) ListProviders(_ context.Context, _ *connect.Request[rochev1.ListProvidersRequest]) (*connect.Response[rochev1.ListProvidersResponse], error) {
	resp := &rochev1.ListProvidersResponse{}
	for _, n := range s.d.ledger.Providers() {
		p, err := s.d.ledger.Provider(n)
		if err != nil {
			return nil, wire.ToStatus(err)
		}
		caps := p.Capabilities()
		caps.Leases = true // roched holds any sandbox for its client (Hold, lease.go)
		resp.Providers = append(resp.Providers, &rochev1.ProviderInfo{Name: n, Capabilities: wire.CapsToProto(caps)})
	}
	return connect.NewResponse(resp), nil
}
