package mcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Background commands for models: start one (a server, a long build), read its output
// from offsets as it goes, and kill it. The command belongs to the sandbox, so a model
// reads it over as many calls as it likes, each from the offsets the last one returned.

// MaxWaitSecs bounds how long read_command_output waits for output or the command's end.
const MaxWaitSecs = 60

func (s *Server) addCommandTools() {
	addTool(s.server, &mcp.Tool{
		Name:  "start_command",
		Title: "Start a background command in a sandbox",
		Description: "Start a long-running command (a server, a build, a watcher) in a sandbox and return its pid at once; " +
			"it keeps running after this call, until it ends, kill_command stops it, or the sandbox ends. Read its output with " +
			"read_command_output, from offset 0 and then from the offsets each read returns. The command is an argv list, " +
			`e.g. ["python3", "-m", "http.server", "8000"] or ["sh", "-c", "make && ./run"].`,
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)},
	}, s.startCommand)
	addTool(s.server, &mcp.Tool{
		Name:  "read_command_output",
		Title: "Read a background command's output",
		Description: "Read a background command's stdout and stderr from byte offsets (0 for the start; then the next_stdout_offset " +
			"and next_stderr_offset the previous read returned), waiting up to wait_secs for output to come. Says whether it " +
			"still runs and, once it ended, its exit code. The sandbox keeps the last 16 MiB of each stream: an offset before " +
			"that is refused with the first offset still kept.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, s.readCommandOutput)
	addTool(s.server, &mcp.Tool{
		Name:        "list_commands",
		Title:       "List a sandbox's background commands",
		Description: "List a sandbox's background commands, running or ended, with their pids, tags, exit codes and how much output each wrote.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, s.listCommands)
	addTool(s.server, &mcp.Tool{
		Name:        "kill_command",
		Title:       "Stop a background command",
		Description: "Stop a background command and everything it started: SIGKILL by default, or signal TERM (or INT, HUP) to let it end cleanly.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, s.killCommand)
}

// runner is the durable commands of the session's sandbox id.
func (s *Server) runner(session *mcp.ServerSession, id string) (roche.BackgroundRunner, error) {
	p, err := s.own(session, id)
	if err != nil {
		return nil, err
	}
	r, ok := p.(roche.BackgroundRunner)
	if !ok || !p.Capabilities().Processes {
		return nil, fmt.Errorf("%w: the %s provider has no background commands: use exec (or run_code) instead", roche.ErrUnsupported, p.Name())
	}
	return r, nil
}

// StartCommandInput is start_command's arguments.
type StartCommandInput struct {
	SandboxID   string            `json:"sandbox_id" jsonschema:"the sandbox's id, from create_sandbox"`
	Command     []string          `json:"command" jsonschema:"the program and its arguments, e.g. [\"python3\", \"-m\", \"http.server\", \"8000\"]"`
	Tag         string            `json:"tag,omitempty" jsonschema:"a name for the command, shown by list_commands"`
	TimeoutSecs float64           `json:"timeout_secs,omitempty" jsonschema:"kill the command after this many seconds (default: it runs for the sandbox's remaining lifetime)"`
	Env         map[string]string `json:"env,omitempty" jsonschema:"environment variables for this command"`
	Workdir     string            `json:"workdir,omitempty" jsonschema:"working directory for this command"`
}

// StartCommandOutput is a started command.
type StartCommandOutput struct {
	PID int    `json:"pid"`
	Tag string `json:"tag,omitempty"`
}

func (s *Server) startCommand(ctx context.Context, req *mcp.CallToolRequest, in StartCommandInput) (*mcp.CallToolResult, StartCommandOutput, error) {
	if len(in.Command) == 0 {
		return nil, StartCommandOutput{}, fmt.Errorf(`%w: command is empty: give the program and its arguments, e.g. ["python3", "-m", "http.server"]`, roche.ErrInvalidConfig)
	}
	timeout, err := wire.ExecTimeout(in.TimeoutSecs)
	if err != nil {
		return nil, StartCommandOutput{}, err
	}
	r, err := s.runner(req.Session, in.SandboxID)
	if err != nil {
		return nil, StartCommandOutput{}, err
	}
	c, err := r.StartCommand(ctx, in.SandboxID, roche.CommandRequest{Cmd: in.Command, Env: in.Env, Workdir: in.Workdir, Timeout: timeout, Tag: in.Tag})
	if err != nil {
		return nil, StartCommandOutput{}, err
	}
	out := StartCommandOutput{PID: c.PID, Tag: c.Tag}
	text := fmt.Sprintf("started: pid %d; read its output with read_command_output (sandbox_id %s, pid %d, offsets 0)", c.PID, in.SandboxID, c.PID)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, out, nil
}

// ReadCommandInput is read_command_output's arguments.
type ReadCommandInput struct {
	SandboxID    string  `json:"sandbox_id" jsonschema:"the sandbox's id, from create_sandbox"`
	PID          int     `json:"pid" jsonschema:"the command's pid, from start_command"`
	StdoutOffset int64   `json:"stdout_offset,omitempty" jsonschema:"where in stdout to read from: 0 for its start, then the next_stdout_offset the last read returned"`
	StderrOffset int64   `json:"stderr_offset,omitempty" jsonschema:"where in stderr to read from: 0 for its start, then the next_stderr_offset the last read returned"`
	WaitSecs     float64 `json:"wait_secs,omitempty" jsonschema:"wait up to this many seconds (at most 60) for output or the command's end; 0 returns what there is now"`
	MaxOutput    int     `json:"max_output_bytes,omitempty" jsonschema:"return at most this many bytes of each of stdout and stderr (default 100 KiB, at most 10 MiB); read again from the next offsets for more"`
}

// ReadCommandOutput is what a read returned, and where the next one starts.
type ReadCommandOutput struct {
	Stdout           string `json:"stdout"`
	Stderr           string `json:"stderr"`
	NextStdoutOffset int64  `json:"next_stdout_offset"`
	NextStderrOffset int64  `json:"next_stderr_offset"`
	// More: there was more output than max_output_bytes; read again from the next offsets.
	More    bool `json:"more"`
	Running bool `json:"running"`
	// Once ended: its exit code (-1 when it cannot be known), the signal that killed it,
	// and why the code is unknown.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   int    `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Unknown  string `json:"unknown,omitempty"`
}

func (s *Server) readCommandOutput(ctx context.Context, req *mcp.CallToolRequest, in ReadCommandInput) (*mcp.CallToolResult, ReadCommandOutput, error) {
	switch {
	case in.PID <= 0:
		return nil, ReadCommandOutput{}, fmt.Errorf("%w: pid %d: give the pid start_command returned (list_commands shows them)", roche.ErrInvalidConfig, in.PID)
	case in.StdoutOffset < 0 || in.StderrOffset < 0:
		return nil, ReadCommandOutput{}, fmt.Errorf("%w: offsets are byte offsets from the command's start: 0 or more", roche.ErrInvalidConfig)
	case in.WaitSecs < 0 || in.WaitSecs > MaxWaitSecs:
		return nil, ReadCommandOutput{}, fmt.Errorf("%w: wait_secs %v: give 0 to %d", roche.ErrInvalidConfig, in.WaitSecs, MaxWaitSecs)
	}
	limit := in.MaxOutput
	if limit <= 0 {
		limit = DefaultOutputLimit
	}
	limit = min(limit, roche.DefaultOutputLimit)
	r, err := s.runner(req.Session, in.SandboxID)
	if err != nil {
		return nil, ReadCommandOutput{}, err
	}
	// Whatever is kept comes at once; past it, the read waits up to wait_secs for more,
	// or returns once it has some (a model reads on from the next offsets).
	wait := time.Duration(in.WaitSecs * float64(time.Second))
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	timer := time.AfterFunc(max(wait, 200*time.Millisecond), stop)
	defer timer.Stop()
	var bufs [3]strings.Builder // by roche.Stream
	next := roche.CommandOffsets{Stdout: in.StdoutOffset, Stderr: in.StderrOffset}
	more := false
	end, err := r.ConnectCommand(cctx, in.SandboxID, roche.CommandSelector{PID: in.PID}, next, roche.CommandOutput{
		Data: func(st roche.Stream, off int64, data []byte) error {
			b := &bufs[st]
			if room := limit - b.Len(); len(data) > room {
				// What passes the cap is left for the next read, from the offset after
				// the last byte returned.
				data = utf8Prefix(data, room)
				more = true
				stop()
				if len(data) == 0 {
					return nil
				}
			}
			b.Write(data)
			if st == roche.StreamStderr {
				next.Stderr = off + int64(len(data))
			} else {
				next.Stdout = off + int64(len(data))
			}
			if wait > 0 {
				// Some output came: return it soon, with what follows in the next moment.
				timer.Reset(100 * time.Millisecond)
			}
			return nil
		},
	})
	out := ReadCommandOutput{
		Stdout: strings.ToValidUTF8(bufs[roche.StreamStdout].String(), "\uFFFD"), Stderr: strings.ToValidUTF8(bufs[roche.StreamStderr].String(), "\uFFFD"),
		NextStdoutOffset: next.Stdout, NextStderrOffset: next.Stderr, More: more,
	}
	switch {
	case err == nil:
		code := end.ExitCode
		out.ExitCode, out.Signal, out.TimedOut, out.Unknown = &code, end.Signal, end.TimedOut, end.Unknown
	case cctx.Err() != nil && ctx.Err() == nil:
		out.Running = true // the read's own end: the command goes on
	default:
		return nil, ReadCommandOutput{}, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: readText(in.PID, out)}}}, out, nil
}

// utf8Prefix is at most n bytes of p, cut at a character's start.
func utf8Prefix(p []byte, n int) []byte {
	n = max(n, 0)
	if n >= len(p) {
		return p
	}
	for n > 0 && !utf8.RuneStart(p[n]) {
		n--
	}
	return p[:n]
}

func readText(pid int, o ReadCommandOutput) string {
	var b strings.Builder
	switch {
	case o.Running:
		fmt.Fprintf(&b, "pid %d is still running", pid)
	case o.Unknown != "":
		fmt.Fprintf(&b, "pid %d ended; its exit code is unknown: %s", pid, o.Unknown)
	case o.Signal != 0:
		fmt.Fprintf(&b, "pid %d was killed by signal %d (exit code %d)", pid, o.Signal, *o.ExitCode)
	default:
		fmt.Fprintf(&b, "pid %d exited with code %d", pid, *o.ExitCode)
	}
	if o.TimedOut {
		b.WriteString(" (timed out: it was killed)")
	}
	fmt.Fprintf(&b, "; next offsets: stdout %d, stderr %d", o.NextStdoutOffset, o.NextStderrOffset)
	if o.More {
		b.WriteString(" (more output follows: read again from them)")
	}
	fmt.Fprintf(&b, "\n--- stdout ---\n%s", o.Stdout)
	if o.Stderr != "" {
		fmt.Fprintf(&b, "\n--- stderr ---\n%s", o.Stderr)
	}
	return b.String()
}

// ListCommandsInput is list_commands' arguments.
type ListCommandsInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id, from create_sandbox"`
}

// CommandSummary is one listed command.
type CommandSummary struct {
	PID         int      `json:"pid"`
	Tag         string   `json:"tag,omitempty"`
	Command     []string `json:"command"`
	Running     bool     `json:"running"`
	ExitCode    *int     `json:"exit_code,omitempty"`
	Unknown     string   `json:"unknown,omitempty"`
	StdoutBytes int64    `json:"stdout_bytes"`
	StderrBytes int64    `json:"stderr_bytes"`
}

// ListCommandsOutput is a sandbox's commands.
type ListCommandsOutput struct {
	Commands []CommandSummary `json:"commands"`
}

func (s *Server) listCommands(ctx context.Context, req *mcp.CallToolRequest, in ListCommandsInput) (*mcp.CallToolResult, ListCommandsOutput, error) {
	r, err := s.runner(req.Session, in.SandboxID)
	if err != nil {
		return nil, ListCommandsOutput{}, err
	}
	list, err := r.Commands(ctx, in.SandboxID)
	if err != nil {
		return nil, ListCommandsOutput{}, err
	}
	out := ListCommandsOutput{Commands: []CommandSummary{}}
	var b strings.Builder
	for _, c := range list {
		cs := CommandSummary{PID: c.PID, Tag: c.Tag, Command: c.Cmd, Running: c.Running, StdoutBytes: c.Written.Stdout, StderrBytes: c.Written.Stderr}
		state := "running"
		if c.End != nil {
			code := c.End.ExitCode
			cs.ExitCode, cs.Unknown = &code, c.End.Unknown
			state = fmt.Sprintf("exited %d", code)
		}
		out.Commands = append(out.Commands, cs)
		fmt.Fprintf(&b, "pid %d %s: %s\n", c.PID, state, strings.Join(c.Cmd, " "))
	}
	if len(list) == 0 {
		b.WriteString("no background commands")
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, out, nil
}

// KillCommandInput is kill_command's arguments.
type KillCommandInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id, from create_sandbox"`
	PID       int    `json:"pid" jsonschema:"the command's pid, from start_command"`
	Signal    string `json:"signal,omitempty" jsonschema:"KILL (the default), TERM, INT or HUP"`
}

// KillCommandOutput says whether there was a running command to signal.
type KillCommandOutput struct {
	Signalled bool `json:"signalled"`
}

var signalsByName = map[string]syscall.Signal{"KILL": syscall.SIGKILL, "TERM": syscall.SIGTERM, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP}

func (s *Server) killCommand(ctx context.Context, req *mcp.CallToolRequest, in KillCommandInput) (*mcp.CallToolResult, KillCommandOutput, error) {
	sig, ok := signalsByName[strings.TrimPrefix(strings.ToUpper(in.Signal), "SIG")]
	if in.Signal == "" {
		sig, ok = syscall.SIGKILL, true
	}
	if !ok {
		return nil, KillCommandOutput{}, fmt.Errorf("%w: signal %q: give KILL, TERM, INT or HUP", roche.ErrInvalidConfig, in.Signal)
	}
	r, err := s.runner(req.Session, in.SandboxID)
	if err != nil {
		return nil, KillCommandOutput{}, err
	}
	err = r.SignalCommand(ctx, in.SandboxID, roche.CommandSelector{PID: in.PID}, int(sig))
	if errors.Is(err, roche.ErrNotFound) {
		// Idempotent: a command already ended is stopped.
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("pid %d was not running", in.PID)}}}, KillCommandOutput{}, nil
	}
	if err != nil {
		return nil, KillCommandOutput{}, err
	}
	text := fmt.Sprintf("sent %s to pid %d; read_command_output shows how it ended", strings.TrimPrefix(sigName(sig), "SIG"), in.PID)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, KillCommandOutput{Signalled: true}, nil
}

func sigName(s syscall.Signal) string {
	for name, v := range signalsByName {
		if v == s {
			return name
		}
	}
	return fmt.Sprint(int(s))
}
