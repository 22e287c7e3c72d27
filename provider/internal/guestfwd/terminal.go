package guestfwd

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
)

var _ roche.Terminal = Forwarder{}

// terminalRequest is req as the agent takes it: on a terminal, for the rest of the
// sandbox's life.
func (t Target) terminalRequest(req roche.TerminalRequest) guest.Request {
	r := t.request(roche.ExecRequest{Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir}, max(time.Until(t.Expires), time.Second))
	r.TTY, r.Cols, r.Rows = true, req.Size.Cols, req.Size.Rows
	return r
}

// Shell implements roche.Terminal: one agent connection carries the typing (its end
// ends the terminal's input), the resizes and the output; the agent kills the shell
// when the connection closes.
func (f Forwarder) Shell(ctx context.Context, id string, req roche.TerminalRequest, tio roche.TerminalIO) (int, error) {
	if err := req.Validate(); err != nil {
		return 0, err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return 0, err
	}
	var resize chan guest.Winsize
	if tio.Resize != nil {
		resize = make(chan guest.Winsize)
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case s := <-tio.Resize:
					select {
					case resize <- guest.Winsize{Cols: s.Cols, Rows: s.Rows}:
					case <-done:
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	res, err := t.Agent.Exec(ctx, t.terminalRequest(req), guest.ExecOptions{
		// The agent's own word on a command that could not start ("command not
		// found", then exit 127) is shown on the terminal, as a shell's would be.
		Stdin: tio.Stdin, Stdout: tio.Output, Stderr: tio.Output, Resize: resize,
	})
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("shell in sandbox %s: %w", id, ctx.Err())
		}
		return 0, t.fail(err)
	}
	return res.ExitCode, nil
}

// StartTerminal implements roche.Terminal.
func (f Forwarder) StartTerminal(ctx context.Context, id string, req roche.TerminalRequest) (int, error) {
	if err := req.Validate(); err != nil {
		return 0, err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return 0, err
	}
	st, err := t.Agent.Start(ctx, t.terminalRequest(req))
	if err != nil {
		return 0, t.fail(err)
	}
	return st.PID, nil
}

// AttachTerminal implements roche.Terminal.
func (f Forwarder) AttachTerminal(ctx context.Context, id string, pid int, w io.Writer) (roche.ExecResult, error) {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return roche.ExecResult{}, err
	}
	return t.attach(ctx, pid, w)
}

// TerminalInput implements roche.Terminal.
func (f Forwarder) TerminalInput(ctx context.Context, id string, pid int, data []byte) error {
	if len(data) > guest.MaxChunk {
		return fmt.Errorf("%w: %d bytes of input at once is over the limit of %d", roche.ErrInvalidConfig, len(data), guest.MaxChunk)
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.Input(ctx, pid, data))
}

// EndTerminalInput implements roche.Terminal.
func (f Forwarder) EndTerminalInput(ctx context.Context, id string, pid int) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.EndInput(ctx, pid))
}

// ResizeTerminal implements roche.Terminal.
func (f Forwarder) ResizeTerminal(ctx context.Context, id string, pid int, size roche.TerminalSize) error {
	if err := size.Validate(); err != nil {
		return err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.Resize(ctx, pid, guest.Winsize{Cols: size.Cols, Rows: size.Rows}))
}

// KillTerminal implements roche.Terminal.
func (f Forwarder) KillTerminal(ctx context.Context, id string, pid int) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.kill(ctx, pid)
}
