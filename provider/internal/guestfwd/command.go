package guestfwd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
)

var _ roche.BackgroundRunner = Forwarder{}

// StartCommand implements roche.BackgroundRunner.
func (f Forwarder) StartCommand(ctx context.Context, id string, req roche.CommandRequest) (roche.Command, error) {
	if err := req.Validate(); err != nil {
		return roche.Command{}, err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return roche.Command{}, err
	}
	r := t.request(roche.ExecRequest{Cmd: req.Cmd, Env: req.Env, Workdir: req.Workdir, IdempotencyKey: req.IdempotencyKey},
		t.timeout(roche.ExecRequest{Timeout: req.Timeout}))
	r.Tag, r.Stdin, r.Window, r.MaxDurable = req.Tag, req.Stdin, req.Window, req.MaxRunning
	st, err := t.Agent.Start(ctx, r)
	if err != nil {
		return roche.Command{}, t.fail(err)
	}
	window := req.Window
	if window == 0 {
		window = roche.DefaultCommandWindow
	}
	return roche.Command{
		PID: st.PID, Tag: st.Tag, Cmd: req.Cmd, Env: req.Env, Workdir: r.Cwd, Stdin: req.Stdin, Running: true,
		Window: window, Existing: st.Existing,
	}, nil
}

// Commands implements roche.BackgroundRunner.
func (f Forwarder) Commands(ctx context.Context, id string) ([]roche.Command, error) {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return nil, err
	}
	list, err := t.Agent.Processes(ctx)
	if err != nil {
		return nil, t.fail(err)
	}
	out := make([]roche.Command, len(list))
	for i, pr := range list {
		out[i] = Command(pr)
	}
	return out, nil
}

// ConnectCommand implements roche.BackgroundRunner. A connection the agent dropped
// because its sandbox stopped, or that broke with the sandbox gone, ends with the exit
// status Unknown: the command ended with its sandbox, and its status was not seen.
func (f Forwarder) ConnectCommand(ctx context.Context, id string, sel roche.CommandSelector, from roche.CommandOffsets, out roche.CommandOutput) (roche.CommandEnd, error) {
	if err := sel.Validate(); err != nil {
		return roche.CommandEnd{}, err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return roche.CommandEnd{}, err
	}
	w := &offsetWriter{out: out}
	res, err := t.Agent.Connect(ctx, guest.Request{PID: sel.PID, Tag: sel.Tag, From: &guest.Offsets{Stdout: from.Stdout, Stderr: from.Stderr}}, guest.ExecOptions{
		Started: func(st guest.Started) {
			w.start(st)
		},
		Stdout: streamWriter{w, roche.StreamStdout},
		Stderr: streamWriter{w, roche.StreamStderr},
	})
	if err == nil {
		return CommandEnd(res), nil
	}
	if w.err != nil {
		return roche.CommandEnd{}, w.err
	}
	if ctx.Err() != nil {
		return roche.CommandEnd{}, fmt.Errorf("following the command in sandbox %s: %w", id, ctx.Err())
	}
	var ae *guest.Error
	switch {
	case errors.As(err, &ae) && ae.Code == guest.CodeStopping:
		return roche.CommandEnd{ExitCode: -1, Unknown: ae.Message}, nil
	case errors.As(err, &ae):
		return roche.CommandEnd{}, t.fail(err)
	case w.started && t.goneWithin(goneWait):
		return roche.CommandEnd{ExitCode: -1, Unknown: fmt.Sprintf("sandbox %s stopped while the command ran (destroyed, its lifetime over, or its lease lost); its exit status was not seen", id)}, nil
	}
	return roche.CommandEnd{}, t.fail(err)
}

// goneWait is how long a connection cut under a command waits for its sandbox to be
// reported gone: a runtime tearing a sandbox down still lists it for a moment after its
// agent died.
const goneWait = 3 * time.Second

// goneWithin reports whether the sandbox is gone, asking again for up to d.
func (t Target) goneWithin(d time.Duration) bool {
	if t.Gone == nil {
		return false
	}
	deadline := time.Now().Add(d)
	for {
		if t.Gone() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// offsetWriter passes a connection's output on with each piece's offset.
type offsetWriter struct {
	out     roche.CommandOutput
	started bool
	next    [3]int64 // by roche.Stream
	err     error    // the caller's, from out.Data
}

func (w *offsetWriter) start(st guest.Started) {
	w.started = true
	if st.From != nil {
		w.next[roche.StreamStdout], w.next[roche.StreamStderr] = st.From.Stdout, st.From.Stderr
	}
	if w.out.Started != nil {
		from := roche.CommandOffsets{}
		if st.From != nil {
			from = Offsets(*st.From)
		}
		w.out.Started(roche.CommandStart{PID: st.PID, Tag: st.Tag, From: from, Existing: st.Existing})
	}
}

type streamWriter struct {
	w      *offsetWriter
	stream roche.Stream
}

// Write passes p on. The caller's first error is kept and nothing more is passed on;
// the connection itself ends with the caller's context (roched's call).
func (s streamWriter) Write(p []byte) (int, error) {
	w := s.w
	off := w.next[s.stream]
	w.next[s.stream] += int64(len(p))
	if w.err == nil && w.out.Data != nil {
		w.err = w.out.Data(s.stream, off, p)
	}
	return len(p), nil
}

// SendCommandInput implements roche.BackgroundRunner.
func (f Forwarder) SendCommandInput(ctx context.Context, id string, sel roche.CommandSelector, data []byte) error {
	if err := sel.Validate(); err != nil {
		return err
	}
	if len(data) > guest.MaxChunk {
		return fmt.Errorf("%w: %d bytes of input at once is over the limit of %d", roche.ErrInvalidConfig, len(data), guest.MaxChunk)
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.SendInput(ctx, guest.Selector{PID: sel.PID, Tag: sel.Tag}, data, false))
}

// CloseCommandInput implements roche.BackgroundRunner.
func (f Forwarder) CloseCommandInput(ctx context.Context, id string, sel roche.CommandSelector) error {
	if err := sel.Validate(); err != nil {
		return err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.SendInput(ctx, guest.Selector{PID: sel.PID, Tag: sel.Tag}, nil, true))
}

// SignalCommand implements roche.BackgroundRunner.
func (f Forwarder) SignalCommand(ctx context.Context, id string, sel roche.CommandSelector, signal int) error {
	if err := sel.Validate(); err != nil {
		return err
	}
	if signal <= 0 || signal > 64 {
		return fmt.Errorf("%w: signal %d is not a signal number (1 to 64: 15 is SIGTERM, 9 SIGKILL)", roche.ErrInvalidConfig, signal)
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.SignalCommand(ctx, guest.Selector{PID: sel.PID, Tag: sel.Tag}, signal))
}

// attach follows pid's output from the first byte kept to w, for the terminals.
func (t Target) attach(ctx context.Context, pid int, w io.Writer) (roche.ExecResult, error) {
	res, err := t.Agent.Attach(ctx, pid, guest.ExecOptions{Stdout: w, Stderr: w})
	if err != nil {
		return roche.ExecResult{}, t.fail(err)
	}
	return roche.ExecResult{
		ExitCode: res.ExitCode, TimedOut: res.TimedOut, Truncated: res.Truncated,
		OOMKilled: res.OOMKilled, Duration: time.Duration(res.DurationNS), Receipt: receiptOf(res.Receipt),
	}, nil
}

// kill kills pid's process group.
func (t Target) kill(ctx context.Context, pid int) error {
	return t.failOrNil(t.Agent.Signal(ctx, pid, int(syscall.SIGKILL)))
}
