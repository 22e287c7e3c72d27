package daemon

import (
	"context"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

func codeChunk(c *rochev1.OutputChunk) *rochev1.RunCodeResponse {
	return &rochev1.RunCodeResponse{Event: &rochev1.RunCodeResponse_Output{Output: c}}
}

// RunCode streams a cell's output and rich results as the context produces them, then
// the execution's summary.
func (s *service) RunCode(ctx context.Context, req *connect.Request[rochev1.RunCodeRequest], stream *connect.ServerStream[rochev1.RunCodeResponse]) error {
	t, err := tenantOf(ctx)
	if err != nil {
		return wire.ToStatus(err)
	}
	r, err := wire.CodeFromProto(req.Msg)
	if err != nil {
		return wire.ToStatus(err)
	}
	sender := newSender(stream)
	r.Stdout = chunkWriter[rochev1.RunCodeResponse]{sender, rochev1.OutputStream_OUTPUT_STREAM_STDOUT, codeChunk}
	r.Stderr = chunkWriter[rochev1.RunCodeResponse]{sender, rochev1.OutputStream_OUTPUT_STREAM_STDERR, codeChunk}
	var streamed atomic.Int64
	r.OnResult = func(res roche.CodeResult) {
		streamed.Add(1)
		_ = sender.send(&rochev1.RunCodeResponse{Event: &rochev1.RunCodeResponse_Result{Result: wire.CodeResultToProto(res)}})
	}
	stop := sender.heartbeats(s.d.cfg.HeartbeatInterval, func(now time.Time) *rochev1.RunCodeResponse {
		return &rochev1.RunCodeResponse{Event: &rochev1.RunCodeResponse_Heartbeat{
			Heartbeat: &rochev1.Heartbeat{Time: timestamppb.New(now)},
		}}
	})
	ex, err := s.d.ledger.RunCode(ctx, t, req.Msg.SandboxId, r)
	stop()
	s.d.audit(ctx, "run_code", err, "id", req.Msg.SandboxId, "context", ex.Context, "bytes", len(r.Code))
	if err != nil {
		sender.close()
		return wire.ToStatus(err)
	}
	// Results a provider kept without passing them on as produced go now, in order.
	for _, res := range ex.Results[min(int(streamed.Load()), len(ex.Results)):] {
		if err := sender.send(&rochev1.RunCodeResponse{Event: &rochev1.RunCodeResponse_Result{Result: wire.CodeResultToProto(res)}}); err != nil {
			sender.close()
			return err
		}
	}
	err = sender.send(&rochev1.RunCodeResponse{Event: &rochev1.RunCodeResponse_Execution{Execution: wire.ExecutionToProto(ex, false)}})
	sender.close()
	return err
}

func (s *service) CreateContext(ctx context.Context, req *connect.Request[rochev1.CreateContextRequest]) (*connect.Response[rochev1.CreateContextResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	c, err := s.d.ledger.CreateContext(ctx, t, req.Msg.SandboxId, wire.ContextOptionsFromProto(req.Msg))
	s.d.audit(ctx, "create_context", err, "id", req.Msg.SandboxId, "context", c.ID, "language", c.Language)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.CreateContextResponse{Context: wire.ContextToProto(c)}), nil
}

func (s *service) ListContexts(ctx context.Context, req *connect.Request[rochev1.ListContextsRequest]) (*connect.Response[rochev1.ListContextsResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	list, err := s.d.ledger.Contexts(ctx, t, req.Msg.SandboxId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	resp := &rochev1.ListContextsResponse{}
	for _, c := range list {
		resp.Contexts = append(resp.Contexts, wire.ContextToProto(c))
	}
	return connect.NewResponse(resp), nil
}

func (s *service) RestartContext(ctx context.Context, req *connect.Request[rochev1.RestartContextRequest]) (*connect.Response[rochev1.RestartContextResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	err = s.d.ledger.RestartContext(ctx, t, req.Msg.SandboxId, req.Msg.ContextId)
	s.d.audit(ctx, "restart_context", err, "id", req.Msg.SandboxId, "context", req.Msg.ContextId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.RestartContextResponse{}), nil
}

func (s *service) ForkContext(ctx context.Context, req *connect.Request[rochev1.ForkContextRequest]) (*connect.Response[rochev1.ForkContextResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	c, err := s.d.ledger.ForkContext(ctx, t, req.Msg.SandboxId, req.Msg.ContextId)
	s.d.audit(ctx, "fork_context", err, "id", req.Msg.SandboxId, "context", req.Msg.ContextId, "fork", c.ID)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.ForkContextResponse{Context: wire.ContextToProto(c)}), nil
}

func (s *service) RemoveContext(ctx context.Context, req *connect.Request[rochev1.RemoveContextRequest]) (*connect.Response[rochev1.RemoveContextResponse], error) {
	t, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	err = s.d.ledger.RemoveContext(ctx, t, req.Msg.SandboxId, req.Msg.ContextId)
	s.d.audit(ctx, "remove_context", err, "id", req.Msg.SandboxId, "context", req.Msg.ContextId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.RemoveContextResponse{}), nil
}
