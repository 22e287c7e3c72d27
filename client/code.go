package client

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ roche.CodeRunner = (*Provider)(nil)

// RunCode implements roche.CodeRunner through the RunCode stream: output reaches
// req.Stdout and req.Stderr, and results req.OnResult, as the context produces them.
func (p *Provider) RunCode(ctx context.Context, id string, req roche.CodeRequest) (roche.Execution, error) {
	if err := req.Validate(); err != nil {
		return roche.Execution{}, err
	}
	stream, err := p.c.rpc.RunCode(ctx, connect.NewRequest(wire.CodeToProto(id, req)))
	if err != nil {
		return roche.Execution{}, p.c.fromRPC(err)
	}
	defer stream.Close()
	stdout, stderr := kit.NewLogCapture(req.OutputLimit, req.Stdout), kit.NewLogCapture(req.OutputLimit, req.Stderr)
	var results []roche.CodeResult
	var summary *rochev1.CodeExecution
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *rochev1.RunCodeResponse_Output:
			if ev.Output.Stream == rochev1.OutputStream_OUTPUT_STREAM_STDERR {
				stderr.Write(ev.Output.Data)
			} else {
				stdout.Write(ev.Output.Data)
			}
		case *rochev1.RunCodeResponse_Result:
			r := wire.CodeResultFromProto(ev.Result)
			results = append(results, r)
			if req.OnResult != nil {
				req.OnResult(r)
			}
		case *rochev1.RunCodeResponse_Execution:
			summary = ev.Execution
		}
	}
	if err := stream.Err(); err != nil {
		return roche.Execution{}, p.c.fromRPC(err)
	}
	if summary == nil {
		return roche.Execution{}, fmt.Errorf("%w: the daemon ended the code stream without an execution", roche.ErrUnavailable)
	}
	ex := wire.ExecutionFromProto(summary)
	ex.Results = results
	ex.Logs = roche.CodeLogs{Stdout: stdout.Chunks(), Stderr: stderr.Chunks()}
	ex.Truncated = ex.Truncated || stdout.Truncated() || stderr.Truncated()
	return ex, nil
}

// CreateContext implements roche.CodeRunner.
func (p *Provider) CreateContext(ctx context.Context, id string, opts roche.ContextOptions) (roche.CodeContext, error) {
	resp, err := p.c.rpc.CreateContext(ctx, connect.NewRequest(wire.ContextOptionsToProto(id, opts)))
	if err != nil {
		return roche.CodeContext{}, p.c.fromRPC(err)
	}
	return wire.ContextFromProto(resp.Msg.Context), nil
}

// Contexts implements roche.CodeRunner.
func (p *Provider) Contexts(ctx context.Context, id string) ([]roche.CodeContext, error) {
	resp, err := p.c.rpc.ListContexts(ctx, connect.NewRequest(&rochev1.ListContextsRequest{SandboxId: id}))
	if err != nil {
		return nil, p.c.fromRPC(err)
	}
	var list []roche.CodeContext
	for _, c := range resp.Msg.Contexts {
		list = append(list, wire.ContextFromProto(c))
	}
	return list, nil
}

// RestartContext implements roche.CodeRunner.
func (p *Provider) RestartContext(ctx context.Context, id, contextID string) error {
	_, err := p.c.rpc.RestartContext(ctx, connect.NewRequest(&rochev1.RestartContextRequest{SandboxId: id, ContextId: contextID}))
	return p.c.fromRPC(err)
}

// ForkContext implements roche.ContextForker.
func (p *Provider) ForkContext(ctx context.Context, id, contextID string) (roche.CodeContext, error) {
	resp, err := p.c.rpc.ForkContext(ctx, connect.NewRequest(&rochev1.ForkContextRequest{SandboxId: id, ContextId: contextID}))
	if err != nil {
		return roche.CodeContext{}, p.c.fromRPC(err)
	}
	return wire.ContextFromProto(resp.Msg.Context), nil
}

// RemoveContext implements roche.CodeRunner.
func (p *Provider) RemoveContext(ctx context.Context, id, contextID string) error {
	_, err := p.c.rpc.RemoveContext(ctx, connect.NewRequest(&rochev1.RemoveContextRequest{SandboxId: id, ContextId: contextID}))
	return p.c.fromRPC(err)
}
