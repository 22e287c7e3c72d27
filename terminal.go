package roche

import (
	"context"
	"fmt"
	"io"
)

// Terminal runs commands on a pseudo-terminal inside a sandbox, as `docker exec -it`
// does: the terminal is the command's controlling terminal, so a typed Ctrl-C reaches its
// foreground job and a resize reaches it as SIGWINCH. The command runs as the sandbox
// user under every limit of its sandbox. Providers whose sandboxes run roche-agent
// implement it (docker, qemu, firecracker, kubernetes); wasm has no terminals.
type Terminal interface {
	// Shell runs req on a new terminal wired to tio until it exits, and returns its exit
	// status. Ending ctx kills it and everything it started.
	Shell(ctx context.Context, id string, req TerminalRequest, tio TerminalIO) (int, error)
	// StartTerminal starts a terminal session that outlives the call and returns its pid;
	// it runs until its command exits, KillTerminal, or the sandbox ends.
	StartTerminal(ctx context.Context, id string, req TerminalRequest) (int, error)
	// AttachTerminal replays the session's recent output to w (the last OutputLimit's
	// worth), streams the rest and returns its result when it ends. Cancelling ctx
	// detaches; the session goes on.
	AttachTerminal(ctx context.Context, id string, pid int, w io.Writer) (ExecResult, error)
	// TerminalInput types data into the session (keys as a terminal sends them: "\x03"
	// is Ctrl-C).
	TerminalInput(ctx context.Context, id string, pid int, data []byte) error
	// EndTerminalInput ends the session's input, as a pipe's end ends its reader's:
	// from then on its program reads end of input (Ctrl-D) each time it waits for input,
	// whenever it does, even if it set the terminal up after the input was typed.
	EndTerminalInput(ctx context.Context, id string, pid int) error
	// ResizeTerminal sets the session's size.
	ResizeTerminal(ctx context.Context, id string, pid int, size TerminalSize) error
	// KillTerminal kills the session's command and everything it started.
	KillTerminal(ctx context.Context, id string, pid int) error
}

// TerminalSize is a terminal's size in characters; zero fields mean 80×24.
type TerminalSize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// MaxTerminalSide bounds either side of a terminal, as xterm's own limit does.
const MaxTerminalSide = 4096

// Validate checks the size's bounds.
func (s TerminalSize) Validate() error {
	if s.Cols > MaxTerminalSide || s.Rows > MaxTerminalSide {
		return fmt.Errorf("%w: terminal size %dx%d is over %d on a side", ErrInvalidConfig, s.Cols, s.Rows, MaxTerminalSide)
	}
	return nil
}

// TerminalRequest is a command to run on a terminal.
type TerminalRequest struct {
	// Cmd is the argv; empty means the image's shell (/bin/bash, else /bin/sh).
	Cmd []string
	// Env is added to the sandbox's environment (TERM defaults to xterm-256color).
	Env map[string]string
	// Workdir overrides the sandbox's working directory.
	Workdir string
	Size    TerminalSize
}

// Validate checks the request's bounds.
func (r TerminalRequest) Validate() error {
	if err := r.Size.Validate(); err != nil {
		return err
	}
	cmd := r.Cmd
	if len(cmd) == 0 {
		cmd = []string{"sh"} // the image's shell, chosen in the sandbox
	}
	return ExecRequest{Cmd: cmd, Env: r.Env, Workdir: r.Workdir}.Validate()
}

// TerminalIO wires a Shell to its user.
type TerminalIO struct {
	// Stdin is what the user types. Its end is the end of input (as EndTerminalInput),
	// which ends a shell waiting for a command: a terminal's own input never ends.
	Stdin io.Reader
	// Output receives the terminal's output (one stream: stdout and stderr together).
	Output io.Writer
	// Resize, when set, carries the user's new window sizes.
	Resize <-chan TerminalSize
}
