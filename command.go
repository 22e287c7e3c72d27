package roche

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/roche-sandbox/roche/internal/size"
)

// BackgroundRunner runs durable commands: commands that belong to the sandbox, not to
// the call or the connection that started them. One keeps running when its caller
// disconnects, when the caller's process is killed and when roched is killed and
// restarted (the sandbox's lease rules still apply: a leased sandbox ends when its
// holder does, and its commands with it). Its output is kept in a window per stream
// (CommandRequest.Window bytes, the last ones) addressed by absolute byte offsets, so
// a caller that went away reconnects where it left off; output that fell out of the
// window is refused with ErrOutputGone and the first offset still kept, never skipped
// silently. Its exit status is never made up: when it cannot be known (the sandbox
// stopped under the command), CommandEnd.Unknown says why.
//
// Providers whose sandboxes run roche-agent implement it (docker, oci, qemu,
// firecracker, kubernetes), as does roched's Go client; wasm has no background
// commands. The names follow E2B's envd process API (Start, Connect, List, SendInput,
// CloseStdin, SendSignal), which maps onto it one to one.
type BackgroundRunner interface {
	// StartCommand starts req in the background and returns it as it starts (its pid).
	// With req.IdempotencyKey, a start whose key names a command the sandbox still
	// remembers returns that command (Command.Existing) instead of starting another.
	StartCommand(ctx context.Context, id string, req CommandRequest) (Command, error)
	// Commands lists the sandbox's durable commands, running or ended (the last 64
	// ended are kept), oldest first.
	Commands(ctx context.Context, id string) ([]Command, error)
	// ConnectCommand follows the command sel names: out.Started first, with the offsets
	// the replay starts at; then its output from those offsets on, in the order it was
	// written; then what follows as it comes; and it returns how the command ended.
	// Cancelling ctx detaches; the command goes on.
	ConnectCommand(ctx context.Context, id string, sel CommandSelector, from CommandOffsets, out CommandOutput) (CommandEnd, error)
	// SendCommandInput writes data to the stdin of a command started with Stdin (or
	// types it into a terminal session).
	SendCommandInput(ctx context.Context, id string, sel CommandSelector, data []byte) error
	// CloseCommandInput closes the command's stdin: it reads end of file from then on.
	CloseCommandInput(ctx context.Context, id string, sel CommandSelector) error
	// SignalCommand sends signal (e.g. 15 for SIGTERM, 9 for SIGKILL) to the command's
	// process group.
	SignalCommand(ctx context.Context, id string, sel CommandSelector, signal int) error
}

// Durable commands' bounds.
const (
	// DefaultCommandWindow is the output a durable command keeps per stream unless
	// asked for another; MaxCommandWindow the most it may keep.
	DefaultCommandWindow = 16 << 20
	MaxCommandWindow     = 64 << 20
	// MaxTagBytes bounds a command's tag, MaxIdempotencyKeyBytes an idempotency key.
	MaxTagBytes            = 256
	MaxIdempotencyKeyBytes = 256
	// MaxRunningCommands is how many durable commands may run at once in one sandbox
	// (roched may allow fewer: --max-commands).
	MaxRunningCommands = 64
)

// ErrOutputGone: the output asked for fell out of the command's window (its oldest
// output is dropped to keep the last CommandRequest.Window bytes of each stream). The
// message names the first offset still kept of each stream.
var ErrOutputGone = errors.New("output no longer kept")

// CommandRequest is a durable command to start.
type CommandRequest struct {
	// Cmd is the argv; it must not be empty. A shell command line is
	// []string{"/bin/bash", "-l", "-c", line} (E2B's SDKs' way).
	Cmd []string
	// Env is added to the sandbox's environment for this command.
	Env map[string]string
	// Workdir overrides the sandbox's working directory for this command.
	Workdir string
	// Timeout kills the command (and every process it started) after this long; zero
	// means the sandbox's remaining lifetime.
	Timeout time.Duration
	// Tag names the command for its callers: any command call can select it by tag
	// instead of pid (the newest command with the tag).
	Tag string
	// Stdin keeps the command's stdin open for SendCommandInput until
	// CloseCommandInput; without it the command reads /dev/null.
	Stdin bool
	// Window is the output kept per stream, in bytes: zero means DefaultCommandWindow,
	// at most MaxCommandWindow.
	Window int64
	// IdempotencyKey, when set, makes a retried start return the command the first
	// start made instead of starting it again (the sandbox remembers the last 1,024
	// keys, and refuses a key whose command ended and was forgotten).
	IdempotencyKey string
	// MaxRunning, when positive, refuses the start (ErrExhausted) when this many durable
	// commands already run in the sandbox; zero means MaxRunningCommands, the most.
	// roched sets it (--max-commands) whatever its caller says.
	MaxRunning int
}

// Validate checks the request's bounds, reporting every problem at once.
func (r CommandRequest) Validate() error {
	var problems []string
	if err := (ExecRequest{Cmd: r.Cmd, Env: r.Env, Workdir: r.Workdir, Timeout: r.Timeout, IdempotencyKey: r.IdempotencyKey}).Validate(); err != nil {
		problems = append(problems, strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": "))
	}
	switch {
	case len(r.Tag) > MaxTagBytes:
		problems = append(problems, fmt.Sprintf("tag is %d bytes, over the limit of %d", len(r.Tag), MaxTagBytes))
	case strings.ContainsRune(r.Tag, 0):
		problems = append(problems, "tag contains a NUL byte")
	}
	if r.Window < 0 || r.Window > MaxCommandWindow {
		problems = append(problems, fmt.Sprintf("window %d is outside 0 (the default, %s) to %s per stream",
			r.Window, size.String(DefaultCommandWindow), size.String(MaxCommandWindow)))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
}

// checkIdempotencyKey is ExecRequest.Validate's word on a key.
func checkIdempotencyKey(key string) string {
	switch {
	case len(key) > MaxIdempotencyKeyBytes:
		return fmt.Sprintf("idempotency_key is %d bytes, over the limit of %d", len(key), MaxIdempotencyKeyBytes)
	case strings.ContainsRune(key, 0):
		return "idempotency_key contains a NUL byte"
	}
	return ""
}

// CommandSelector names a command: by PID, or, when PID is zero, the newest durable
// command tagged Tag (E2B's ProcessSelector).
type CommandSelector struct {
	PID int    `json:"pid,omitempty"`
	Tag string `json:"tag,omitempty"`
}

// Validate refuses a selector that names nothing, or names twice.
func (s CommandSelector) Validate() error {
	switch {
	case s.PID < 0:
		return fmt.Errorf("%w: pid %d is not a process id", ErrInvalidConfig, s.PID)
	case s.PID == 0 && s.Tag == "":
		return fmt.Errorf("%w: name the command by its pid or its tag", ErrInvalidConfig)
	case s.PID != 0 && s.Tag != "":
		return fmt.Errorf("%w: name the command by its pid or its tag, not both", ErrInvalidConfig)
	case len(s.Tag) > MaxTagBytes:
		return fmt.Errorf("%w: tag is %d bytes, over the limit of %d", ErrInvalidConfig, len(s.Tag), MaxTagBytes)
	}
	return nil
}

func (s CommandSelector) String() string {
	if s.PID != 0 {
		return fmt.Sprintf("pid %d", s.PID)
	}
	return fmt.Sprintf("tag %q", s.Tag)
}

// CommandOffsets are byte offsets into a command's stdout and stderr, counted from the
// command's start. As where a connection starts, a negative offset means the stream's
// end as the connection is made (only what comes next, as E2B's Connect does).
type CommandOffsets struct {
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
}

// Stream names one of a command's output streams.
type Stream int

const (
	StreamStdout Stream = 1
	StreamStderr Stream = 2
)

func (s Stream) String() string {
	switch s {
	case StreamStdout:
		return "stdout"
	case StreamStderr:
		return "stderr"
	}
	return fmt.Sprintf("stream %d", int(s))
}

// CommandStart is the first thing a connection hears: the command, and where in each
// stream the replay starts.
type CommandStart struct {
	PID  int            `json:"pid"`
	Tag  string         `json:"tag,omitempty"`
	From CommandOffsets `json:"from"`
	// Existing: the start's idempotency key named a command started before (a keyed
	// exec that joined it).
	Existing bool `json:"existing,omitempty"`
}

// CommandOutput receives what ConnectCommand streams.
type CommandOutput struct {
	// Started, when set, is called first.
	Started func(CommandStart)
	// Data, when set, is called with each piece of output in the order it was written,
	// with the offset of its first byte in its stream. An error it returns ends the
	// connection (not the command).
	Data func(stream Stream, offset int64, data []byte) error
}

// CommandEnd is how a durable command ended.
type CommandEnd struct {
	// ExitCode is the command's exit status: 128 + Signal when a signal killed it, -1
	// when Unknown.
	ExitCode int `json:"exit_code"`
	// Signal is the signal that killed it, 0 when it exited.
	Signal int `json:"signal,omitempty"`
	// TimedOut: it was killed at its timeout. OOMKilled: for exceeding the memory limit.
	TimedOut  bool          `json:"timed_out,omitempty"`
	OOMKilled bool          `json:"oom_killed,omitempty"`
	Duration  time.Duration `json:"duration_ns"`
	// Unknown, when set, is why the exit status cannot be known: the sandbox stopped or
	// died while the command ran (destroyed, its lifetime over, its lease lost). The
	// command ended with it; no exit status is made up.
	Unknown string `json:"unknown,omitempty"`
}

// Command describes a durable command.
type Command struct {
	PID int      `json:"pid"`
	Tag string   `json:"tag,omitempty"`
	Cmd []string `json:"cmd"`
	// Env and Workdir are as the start gave them (the sandbox's own are not repeated).
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	// TTY: a terminal session (roche shell, CreatePty), whose output is one stream.
	TTY bool `json:"tty,omitempty"`
	// Stdin: its stdin is open for SendCommandInput.
	Stdin     bool      `json:"stdin,omitempty"`
	Running   bool      `json:"running"`
	StartedAt time.Time `json:"started_at"`
	// Window is the output it keeps per stream; First is the offset of the first byte
	// still kept of each stream, Written each stream's length so far.
	Window  int64          `json:"window"`
	First   CommandOffsets `json:"first"`
	Written CommandOffsets `json:"written"`
	// End is how it ended, once it has.
	End *CommandEnd `json:"end,omitempty"`
	// Existing, from StartCommand: the idempotency key named a command started before,
	// which is returned instead of a new one.
	Existing bool `json:"existing,omitempty"`
}
