package client

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

var _ roche.BackgroundRunner = (*Provider)(nil)

// StartCommand implements roche.BackgroundRunner.
func (p *Provider) StartCommand(ctx context.Context, id string, req roche.CommandRequest) (roche.Command, error) {
	if err := req.Validate(); err != nil {
		return roche.Command{}, err
	}
	resp, err := p.c.rpc.StartCommand(ctx, connect.NewRequest(wire.CommandRequestToProto(id, req)))
	if err != nil {
		return roche.Command{}, p.c.fromRPC(err)
	}
	return wire.CommandFromProto(resp.Msg.Command), nil
}

// Commands implements roche.BackgroundRunner.
func (p *Provider) Commands(ctx context.Context, id string) ([]roche.Command, error) {
	resp, err := p.c.rpc.ListCommands(ctx, connect.NewRequest(&rochev1.ListCommandsRequest{SandboxId: id}))
	if err != nil {
		return nil, p.c.fromRPC(err)
	}
	out := make([]roche.Command, len(resp.Msg.Commands))
	for i, c := range resp.Msg.Commands {
		out[i] = wire.CommandFromProto(c)
	}
	return out, nil
}

// ConnectCommand implements roche.BackgroundRunner. The command does not depend on
// this call, nor on roched: a stream that breaks (roched restarted) is connected again
// from the offsets after the last piece delivered, by the caller.
func (p *Provider) ConnectCommand(ctx context.Context, id string, sel roche.CommandSelector, from roche.CommandOffsets, out roche.CommandOutput) (roche.CommandEnd, error) {
	if err := sel.Validate(); err != nil {
		return roche.CommandEnd{}, err
	}
	stream, err := p.c.rpc.ConnectCommand(ctx, connect.NewRequest(&rochev1.ConnectCommandRequest{
		SandboxId: id, Command: wire.SelectorToProto(sel), StdoutOffset: from.Stdout, StderrOffset: from.Stderr,
	}))
	if err != nil {
		return roche.CommandEnd{}, p.c.fromRPC(err)
	}
	defer stream.Close()
	var end *rochev1.CommandEnd
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *rochev1.ConnectCommandResponse_Start:
			if out.Started != nil {
				out.Started(wire.StartFromProto(ev.Start))
			}
		case *rochev1.ConnectCommandResponse_Data:
			if out.Data != nil {
				if err := out.Data(wire.StreamFromProto(ev.Data.Stream), ev.Data.Offset, ev.Data.Data); err != nil {
					return roche.CommandEnd{}, err
				}
			}
		case *rochev1.ConnectCommandResponse_End:
			// Read on to the stream's own end (its trailers): a stream cut short here
			// would leave roched writing to a closed connection.
			end = ev.End
		}
	}
	if end != nil {
		return wire.CommandEndFromProto(end), nil
	}
	if err := stream.Err(); err != nil {
		return roche.CommandEnd{}, p.c.fromRPC(err)
	}
	return roche.CommandEnd{}, fmt.Errorf("%w: roched ended the command's stream without its end", roche.ErrUnavailable)
}

// SendCommandInput implements roche.BackgroundRunner.
func (p *Provider) SendCommandInput(ctx context.Context, id string, sel roche.CommandSelector, data []byte) error {
	if err := sel.Validate(); err != nil {
		return err
	}
	_, err := p.c.rpc.SendCommandInput(ctx, connect.NewRequest(&rochev1.SendCommandInputRequest{SandboxId: id, Command: wire.SelectorToProto(sel), Data: data}))
	return p.c.fromRPC(err)
}

// CloseCommandInput implements roche.BackgroundRunner.
func (p *Provider) CloseCommandInput(ctx context.Context, id string, sel roche.CommandSelector) error {
	if err := sel.Validate(); err != nil {
		return err
	}
	_, err := p.c.rpc.CloseCommandInput(ctx, connect.NewRequest(&rochev1.CloseCommandInputRequest{SandboxId: id, Command: wire.SelectorToProto(sel)}))
	return p.c.fromRPC(err)
}

// SignalCommand implements roche.BackgroundRunner.
func (p *Provider) SignalCommand(ctx context.Context, id string, sel roche.CommandSelector, signal int) error {
	if err := sel.Validate(); err != nil {
		return err
	}
	_, err := p.c.rpc.SignalCommand(ctx, connect.NewRequest(&rochev1.SignalCommandRequest{SandboxId: id, Command: wire.SelectorToProto(sel), Signal: int32(signal)}))
	return p.c.fromRPC(err)
}
