package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/internal/wire"
)

var _ roche.Terminal = (*Provider)(nil)

// Shell implements roche.Terminal with the PTY session calls, which work over HTTP/1.1
// as well as HTTP/2: CreatePty, then ConnectPty with kill_on_close (so the shell ends
// when this call does, or this process dies), with each read of tio.Stdin sent as one
// SendPtyInput (its end as one with end_of_input) and each resize as one ResizePty.
func (p *Provider) Shell(ctx context.Context, id string, req roche.TerminalRequest, tio roche.TerminalIO) (int, error) {
	pid, err := p.StartTerminal(ctx, id, req)
	if err != nil {
		if msg, code, ok := startFailure(err); ok {
			// As the agent's own connection reports it (guestfwd): the agent's word on
			// the terminal, and a shell's exit status.
			if tio.Output != nil {
				_, _ = io.WriteString(tio.Output, msg+"\r\n")
			}
			return code, nil
		}
		return 0, err
	}
	outer := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if tio.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := tio.Stdin.Read(buf)
				if n > 0 && p.TerminalInput(ctx, id, pid, buf[:n]) != nil {
					return
				}
				if err != nil {
					_ = p.EndTerminalInput(ctx, id, pid)
					return
				}
			}
		}()
	}
	if tio.Resize != nil {
		go func() {
			for {
				select {
				case s := <-tio.Resize:
					_ = p.ResizeTerminal(ctx, id, pid, s)
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	res, err := p.attach(ctx, id, pid, tio.Output, true)
	if err != nil {
		if outer.Err() == nil {
			// The daemon's kill_on_close ends the session when the caller goes (ctx,
			// or this process); this ends one whose output stream broke or never began.
			kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = p.KillTerminal(kctx, id, pid)
			kcancel()
		}
		return 0, err
	}
	return res.ExitCode, nil
}

// startFailure recognises a session whose command could not start: the agent refuses
// its start with NOT_FOUND and its own message ("roche-agent: CMD: command not found",
// as it writes on a command's stderr). It returns that message and the exit status a
// shell gives: 127 for a command not found, else 126.
func startFailure(err error) (msg string, code int, ok bool) {
	if !errors.Is(err, roche.ErrNotFound) {
		return "", 0, false
	}
	text := err.Error()
	i := strings.Index(text, guestbin.Name+": ")
	if i < 0 {
		return "", 0, false
	}
	msg = strings.TrimSpace(text[i:])
	code = 126
	if strings.HasSuffix(msg, "command not found") || strings.HasSuffix(msg, "no such file or directory") {
		code = 127
	}
	return msg, code, true
}

// StartTerminal implements roche.Terminal.
func (p *Provider) StartTerminal(ctx context.Context, id string, req roche.TerminalRequest) (int, error) {
	if err := req.Validate(); err != nil {
		return 0, err
	}
	resp, err := p.c.rpc.CreatePty(ctx, connect.NewRequest(wire.TerminalToProto(id, req)))
	if err != nil {
		return 0, p.c.fromRPC(err)
	}
	return int(resp.Msg.Pid), nil
}

// AttachTerminal implements roche.Terminal.
func (p *Provider) AttachTerminal(ctx context.Context, id string, pid int, w io.Writer) (roche.ExecResult, error) {
	return p.attach(ctx, id, pid, w, false)
}

func (p *Provider) attach(ctx context.Context, id string, pid int, w io.Writer, killOnClose bool) (roche.ExecResult, error) {
	stream, err := p.c.rpc.ConnectPty(ctx, connect.NewRequest(&rochev1.ConnectPtyRequest{SandboxId: id, Pid: int32(pid), KillOnClose: killOnClose}))
	if err != nil {
		return roche.ExecResult{}, p.c.fromRPC(err)
	}
	defer stream.Close()
	var result *rochev1.ExecResult
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *rochev1.ConnectPtyResponse_Data:
			if w != nil {
				_, _ = w.Write(ev.Data)
			}
		case *rochev1.ConnectPtyResponse_Result:
			result = ev.Result
		}
	}
	if err := stream.Err(); err != nil {
		return roche.ExecResult{}, p.c.fromRPC(err)
	}
	if result == nil {
		return roche.ExecResult{}, fmt.Errorf("%w: the daemon ended the terminal's output stream without a result", roche.ErrUnavailable)
	}
	return wire.ResultFromProto(result), nil
}

// TerminalInput implements roche.Terminal.
func (p *Provider) TerminalInput(ctx context.Context, id string, pid int, data []byte) error {
	_, err := p.c.rpc.SendPtyInput(ctx, connect.NewRequest(&rochev1.SendPtyInputRequest{SandboxId: id, Pid: int32(pid), Data: data}))
	return p.c.fromRPC(err)
}

// EndTerminalInput implements roche.Terminal.
func (p *Provider) EndTerminalInput(ctx context.Context, id string, pid int) error {
	_, err := p.c.rpc.SendPtyInput(ctx, connect.NewRequest(&rochev1.SendPtyInputRequest{SandboxId: id, Pid: int32(pid), EndOfInput: true}))
	return p.c.fromRPC(err)
}

// ResizeTerminal implements roche.Terminal.
func (p *Provider) ResizeTerminal(ctx context.Context, id string, pid int, size roche.TerminalSize) error {
	_, err := p.c.rpc.ResizePty(ctx, connect.NewRequest(&rochev1.ResizePtyRequest{SandboxId: id, Pid: int32(pid), Size: wire.SizeToProto(size)}))
	return p.c.fromRPC(err)
}

// KillTerminal implements roche.Terminal.
func (p *Provider) KillTerminal(ctx context.Context, id string, pid int) error {
	_, err := p.c.rpc.KillPty(ctx, connect.NewRequest(&rochev1.KillPtyRequest{SandboxId: id, Pid: int32(pid)}))
	return p.c.fromRPC(err)
}
