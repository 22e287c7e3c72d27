package daemon

import (
	"context"
	"errors"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/wire"
)

// terminal resolves the caller's sandbox id and its provider's terminals.
func (d *Daemon) terminal(ctx context.Context, id string, req *roche.TerminalRequest) (ledger.Target, roche.Terminal, error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return ledger.Target{}, nil, err
	}
	return d.ledger.Terminal(tn, id, req)
}

func (s *service) CreatePty(ctx context.Context, req *connect.Request[rochev1.CreatePtyRequest]) (*connect.Response[rochev1.CreatePtyResponse], error) {
	r, err := wire.TerminalFromProto(req.Msg)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, term, err := s.d.terminal(ctx, req.Msg.SandboxId, &r)
	var pid int
	if err == nil {
		pid, err = term.StartTerminal(ctx, t.ID, r)
	}
	s.d.audit(ctx, "create_pty", err, "id", req.Msg.SandboxId, "argv", r.Cmd, "pid", pid)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.CreatePtyResponse{Pid: int32(pid)}), nil
}

// ptySender serialises a ConnectPty stream's messages: output from the attach, heartbeats
// from a ticker.
type ptySender struct {
	mu     sync.Mutex
	stream *connect.ServerStream[rochev1.ConnectPtyResponse]
	last   time.Time
	closed bool
}

func (s *ptySender) send(msg *rochev1.ConnectPtyResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("stream closed")
	}
	s.last = time.Now()
	return s.stream.Send(msg)
}

func (s *ptySender) quietSince(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now.Sub(s.last)
}

func (s *ptySender) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// Write sends terminal output in chunks of at most maxChunk.
func (s *ptySender) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		c := p[:min(len(p), maxChunk)]
		p = p[len(c):]
		if err := s.send(&rochev1.ConnectPtyResponse{Event: &rochev1.ConnectPtyResponse_Data{Data: c}}); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// killTimeout bounds the kill of a session whose kill_on_close stream ended.
const killTimeout = 10 * time.Second

func (s *service) ConnectPty(ctx context.Context, req *connect.Request[rochev1.ConnectPtyRequest], stream *connect.ServerStream[rochev1.ConnectPtyResponse]) error {
	t, term, err := s.d.terminal(ctx, req.Msg.SandboxId, nil)
	if err != nil {
		return wire.ToStatus(err)
	}
	pid := int(req.Msg.Pid)
	sender := &ptySender{stream: stream, last: time.Now()}
	every := s.d.cfg.HeartbeatInterval
	done := make(chan struct{})
	var beats sync.WaitGroup
	beats.Add(1)
	go func() {
		defer beats.Done()
		tick := time.NewTicker(every / 2)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				if sender.quietSince(now) >= every {
					_ = sender.send(&rochev1.ConnectPtyResponse{Event: &rochev1.ConnectPtyResponse_Heartbeat{
						Heartbeat: &rochev1.Heartbeat{Time: timestamppb.New(now)},
					}})
				}
			}
		}
	}()
	res, err := term.AttachTerminal(ctx, t.ID, pid, sender)
	close(done)
	beats.Wait()
	if err != nil && ctx.Err() != nil && req.Msg.KillOnClose {
		// The caller went away (roche shell's process ended): its shell goes with it.
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
		kerr := term.KillTerminal(kctx, t.ID, pid)
		cancel()
		s.d.audit(ctx, "kill_pty", kerr, "id", t.ID, "pid", pid, "why", "its kill_on_close stream ended")
	}
	if err != nil {
		sender.close()
		return wire.ToStatus(err)
	}
	err = sender.send(&rochev1.ConnectPtyResponse{Event: &rochev1.ConnectPtyResponse_Result{Result: wire.ResultToProto(res, false)}})
	sender.close()
	return err
}

func (s *service) SendPtyInput(ctx context.Context, req *connect.Request[rochev1.SendPtyInputRequest]) (*connect.Response[rochev1.SendPtyInputResponse], error) {
	t, term, err := s.d.terminal(ctx, req.Msg.SandboxId, nil)
	if err == nil {
		err = term.TerminalInput(ctx, t.ID, int(req.Msg.Pid), req.Msg.Data)
	}
	if err == nil && req.Msg.EndOfInput {
		err = term.EndTerminalInput(ctx, t.ID, int(req.Msg.Pid))
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.SendPtyInputResponse{}), nil
}

func (s *service) ResizePty(ctx context.Context, req *connect.Request[rochev1.ResizePtyRequest]) (*connect.Response[rochev1.ResizePtyResponse], error) {
	size, err := wire.SizeFromProto(req.Msg.Size)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, term, err := s.d.terminal(ctx, req.Msg.SandboxId, nil)
	if err == nil {
		err = term.ResizeTerminal(ctx, t.ID, int(req.Msg.Pid), size)
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.ResizePtyResponse{}), nil
}

func (s *service) KillPty(ctx context.Context, req *connect.Request[rochev1.KillPtyRequest]) (*connect.Response[rochev1.KillPtyResponse], error) {
	t, term, err := s.d.terminal(ctx, req.Msg.SandboxId, nil)
	if err == nil {
		err = term.KillTerminal(ctx, t.ID, int(req.Msg.Pid))
	}
	s.d.audit(ctx, "kill_pty", err, "id", req.Msg.SandboxId, "pid", req.Msg.Pid)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.KillPtyResponse{}), nil
}
