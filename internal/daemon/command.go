package daemon

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Durable commands: each call finds the caller's sandbox through the ledger (another
// tenant's sandbox, and so its commands, is not there to find) and forwards to the
// provider, which reaches the sandbox's agent. roched keeps nothing of a command: the
// agent does, so a restarted roched serves the commands its predecessor started.

// commands resolves the caller's sandbox id and its provider's commands.
func (d *Daemon) commands(ctx context.Context, id string) (ledger.Target, roche.BackgroundRunner, error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return ledger.Target{}, nil, err
	}
	return d.ledger.Commands(tn, id)
}

func (s *service) StartCommand(ctx context.Context, req *connect.Request[rochev1.StartCommandRequest]) (*connect.Response[rochev1.StartCommandResponse], error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	r, err := wire.CommandRequestFromProto(req.Msg)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	cmd, err := s.d.ledger.StartCommand(ctx, tn, req.Msg.SandboxId, r)
	s.d.audit(ctx, "start_command", err, "id", req.Msg.SandboxId, "argv", r.Cmd, "tag", r.Tag, "pid", cmd.PID, "existing", cmd.Existing)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.StartCommandResponse{Command: wire.CommandToProto(cmd)}), nil
}

func (s *service) ConnectCommand(ctx context.Context, req *connect.Request[rochev1.ConnectCommandRequest], stream *connect.ServerStream[rochev1.ConnectCommandResponse]) error {
	sel, err := wire.SelectorFromProto(req.Msg.Command)
	if err != nil {
		return wire.ToStatus(err)
	}
	t, r, err := s.d.commands(ctx, req.Msg.SandboxId)
	if err != nil {
		return wire.ToStatus(err)
	}
	sender := newSender(stream)
	stop := sender.heartbeats(s.d.cfg.HeartbeatInterval, func(now time.Time) *rochev1.ConnectCommandResponse {
		return &rochev1.ConnectCommandResponse{Event: &rochev1.ConnectCommandResponse_Heartbeat{
			Heartbeat: &rochev1.Heartbeat{Time: timestamppb.New(now)},
		}}
	})
	from := roche.CommandOffsets{Stdout: req.Msg.StdoutOffset, Stderr: req.Msg.StderrOffset}
	end, err := r.ConnectCommand(ctx, t.ID, sel, from, roche.CommandOutput{
		Started: func(st roche.CommandStart) {
			_ = sender.send(&rochev1.ConnectCommandResponse{Event: &rochev1.ConnectCommandResponse_Start{Start: wire.StartToProto(st)}})
		},
		Data: func(stream roche.Stream, off int64, data []byte) error {
			// In pieces small enough to flow through proxies, each with its offset.
			for len(data) > 0 {
				n := min(len(data), maxChunk)
				msg := &rochev1.ConnectCommandResponse{Event: &rochev1.ConnectCommandResponse_Data{Data: &rochev1.CommandData{
					Stream: wire.StreamToProto(stream), Offset: off, Data: data[:n],
				}}}
				if err := sender.send(msg); err != nil {
					return err
				}
				data, off = data[n:], off+int64(n)
			}
			return nil
		},
	})
	stop()
	if err != nil {
		sender.close()
		return wire.ToStatus(err)
	}
	err = sender.send(&rochev1.ConnectCommandResponse{Event: &rochev1.ConnectCommandResponse_End{End: wire.CommandEndToProto(end)}})
	sender.close()
	return err
}

func (s *service) ListCommands(ctx context.Context, req *connect.Request[rochev1.ListCommandsRequest]) (*connect.Response[rochev1.ListCommandsResponse], error) {
	t, r, err := s.d.commands(ctx, req.Msg.SandboxId)
	var list []roche.Command
	if err == nil {
		list, err = r.Commands(ctx, t.ID)
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	out := &rochev1.ListCommandsResponse{Commands: make([]*rochev1.Command, len(list))}
	for i, c := range list {
		out.Commands[i] = wire.CommandToProto(c)
	}
	return connect.NewResponse(out), nil
}

func (s *service) SendCommandInput(ctx context.Context, req *connect.Request[rochev1.SendCommandInputRequest]) (*connect.Response[rochev1.SendCommandInputResponse], error) {
	sel, err := wire.SelectorFromProto(req.Msg.Command)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, r, err := s.d.commands(ctx, req.Msg.SandboxId)
	if err == nil {
		err = r.SendCommandInput(ctx, t.ID, sel, req.Msg.Data)
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.SendCommandInputResponse{}), nil
}

func (s *service) CloseCommandInput(ctx context.Context, req *connect.Request[rochev1.CloseCommandInputRequest]) (*connect.Response[rochev1.CloseCommandInputResponse], error) {
	sel, err := wire.SelectorFromProto(req.Msg.Command)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, r, err := s.d.commands(ctx, req.Msg.SandboxId)
	if err == nil {
		err = r.CloseCommandInput(ctx, t.ID, sel)
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.CloseCommandInputResponse{}), nil
}

func (s *service) SignalCommand(ctx context.Context, req *connect.Request[rochev1.SignalCommandRequest]) (*connect.Response[rochev1.SignalCommandResponse], error) {
	sel, err := wire.SelectorFromProto(req.Msg.Command)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, r, err := s.d.commands(ctx, req.Msg.SandboxId)
	if err == nil {
		err = r.SignalCommand(ctx, t.ID, sel, int(req.Msg.Signal))
	}
	s.d.audit(ctx, "signal_command", err, "id", req.Msg.SandboxId, "command", sel.String(), "signal", req.Msg.Signal)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.SignalCommandResponse{}), nil
}
