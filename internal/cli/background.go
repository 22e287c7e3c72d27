package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/cli/cliflag"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Durable commands from the command line: roche exec --background starts one and prints
// its pid; roche commands lists, follows, feeds and signals them. They work through
// roched and in direct mode alike: the command lives in the sandbox's agent, not here.

// backgroundFlags are exec's flags for a command started in the background.
type backgroundFlags struct {
	background bool
	tag        string
	keepStdin  bool
	window     string
	key        string
}

func (b *backgroundFlags) add(fs *pflag.FlagSet) {
	fs.BoolVarP(&b.background, "background", "d", false, "start the command in the background and print its pid: it belongs to the sandbox, not to this process\n(roche commands connect PID follows it)")
	fs.StringVar(&b.tag, "tag", "", "with --background, a name for the command: roche commands takes --tag NAME instead of its pid")
	fs.BoolVar(&b.keepStdin, "keep-stdin", false, "with --background, keep the command's stdin open for roche commands send-stdin (until close-stdin)")
	fs.StringVar(&b.window, "window", "", "with --background, the output kept per stream for roche commands connect, e.g. 1m (default 16m, at most 64m)")
	fs.StringVar(&b.key, "idempotency-key", "", "run at most one command per KEY in the sandbox: run again with the same key, it joins the first\n(with --background it prints the first's pid; without, it replays the first's output and result)")
}

// runner finds sandbox id's provider and its durable commands.
func (e *env) runner(id string) (roche.BackgroundRunner, error) {
	if id == "" {
		return nil, errors.New("no sandbox given: pass --sandbox ID (roche list shows them)")
	}
	p, err := e.providers.forID(id)
	if err != nil {
		return nil, err
	}
	r, ok := p.(roche.BackgroundRunner)
	if !ok || !p.Capabilities().Processes {
		return nil, fmt.Errorf("the %s provider has no background commands (its sandboxes are not Linux process trees): use roche exec", p.Name())
	}
	return r, nil
}

// startBackground starts cmd as a durable command and prints its pid (or, with --json,
// the command). With -i, roche's standard input is sent to it and then closed.
func (e *env) startBackground(ctx context.Context, id string, cmd []string, x *execFlags, b *backgroundFlags) error {
	if len(cmd) == 0 {
		return errors.New("no command given: put it after --, e.g. -- python3 -m http.server")
	}
	r, err := e.runner(id)
	if err != nil {
		return err
	}
	env, err := cliflag.ParseEnv(x.env)
	if err != nil {
		return err
	}
	timeout, err := wire.ExecTimeout(x.timeout)
	if err != nil {
		return friendly(err)
	}
	var window int64
	if b.window != "" {
		if window, err = size.Parse(b.window); err != nil {
			return fmt.Errorf("--window %q: %w", b.window, err)
		}
	}
	req := roche.CommandRequest{Cmd: cmd, Env: env, Workdir: x.workdir, Timeout: timeout, Tag: b.tag,
		Stdin: b.keepStdin || x.interactive, Window: window, IdempotencyKey: b.key}
	c, err := r.StartCommand(ctx, id, req)
	if err != nil {
		return friendly(err)
	}
	if x.interactive && !c.Existing {
		if err := e.sendInput(ctx, r, id, roche.CommandSelector{PID: c.PID}, e.stdin); err != nil {
			return err
		}
		if err := r.CloseCommandInput(ctx, id, roche.CommandSelector{PID: c.PID}); err != nil {
			return friendly(err)
		}
	}
	if x.asJSON {
		return e.printJSON(c)
	}
	fmt.Fprintln(e.stdout, c.PID)
	return nil
}

// sendInput sends what in holds to the command's stdin, a piece at a time.
func (e *env) sendInput(ctx context.Context, r roche.BackgroundRunner, id string, sel roche.CommandSelector, in io.Reader) error {
	buf := make([]byte, 128<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			if serr := r.SendCommandInput(ctx, id, sel, buf[:n]); serr != nil {
				return friendly(serr)
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading standard input: %w", err)
		}
	}
}

// selector is the command a roche commands call names: its pid argument, or --tag.
func selector(args []string, tag string) (roche.CommandSelector, error) {
	switch {
	case len(args) > 0 && tag != "":
		return roche.CommandSelector{}, errors.New("name the command by its pid or by --tag, not both")
	case tag != "":
		return roche.CommandSelector{Tag: tag}, nil
	case len(args) == 0:
		return roche.CommandSelector{}, errors.New("name the command: its pid (roche commands list shows them), or --tag NAME")
	}
	pid, err := strconv.Atoi(args[0])
	if err != nil || pid <= 0 {
		return roche.CommandSelector{}, fmt.Errorf("%q is not a pid: give the number roche exec --background printed (roche commands list shows them)", args[0])
	}
	return roche.CommandSelector{PID: pid}, nil
}

// signalNumber reads a signal as a number (15), a name (TERM) or a full name (SIGTERM).
func signalNumber(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n <= 64 {
		return n, nil
	}
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	for sig := syscall.Signal(1); sig < 32; sig++ {
		if strings.EqualFold(strings.TrimPrefix(unixSignalName(sig), "SIG"), name) {
			return int(sig), nil
		}
	}
	return 0, fmt.Errorf("%q is not a signal: give a number (1 to 64) or a name such as TERM, KILL, INT or HUP", s)
}

// unixSignalName is the kernel's name of sig (SIGTERM), whatever the host's own
// signal numbering: commands run on Linux.
func unixSignalName(sig syscall.Signal) string {
	names := [...]string{1: "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGKILL", "SIGUSR1",
		"SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGSTKFLT", "SIGCHLD", "SIGCONT", "SIGSTOP", "SIGTSTP",
		"SIGTTIN", "SIGTTOU", "SIGURG", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO", "SIGPWR", "SIGSYS"}
	if int(sig) < len(names) {
		return names[sig]
	}
	return ""
}

// commandEvent is one line of roche commands connect --json.
type commandEvent struct {
	Start  *commandStartJSON `json:"start,omitempty"`
	Stream string            `json:"stream,omitempty"`
	Offset *int64            `json:"offset,omitempty"`
	Data   []byte            `json:"data,omitempty"` // base64 in JSON
	End    *roche.CommandEnd `json:"end,omitempty"`
}

type commandStartJSON struct {
	PID          int    `json:"pid"`
	Tag          string `json:"tag,omitempty"`
	StdoutOffset int64  `json:"stdout_offset"`
	StderrOffset int64  `json:"stderr_offset"`
}

func (e *env) commandsCommand() *cobra.Command {
	var id, tag string
	c := &cobra.Command{
		Use:     "commands list|connect|send-stdin|close-stdin|kill|signal --sandbox ID",
		Aliases: []string{"command"},
		Short:   "Follow, feed and stop a sandbox's background commands (roche exec --background)",
		Long: `A command started with roche exec --background belongs to the sandbox, not to the
roche that started it: it runs on when that roche exits, when the caller's machine
loses its connection and when roched restarts, until it ends, is killed, or its sandbox
ends. Its output is kept, the last 16 MiB of each stream (exec --window), and addressed
by byte offsets: connect replays it from the offsets given (0 by default) and then
follows it; an offset that fell out of the window is refused with the first offset still
kept, never skipped. Name a command by the pid exec printed, or by its --tag.

connect exits with the command's exit status (128 + the signal when one killed it), and
125 when it cannot be known (the sandbox stopped under the command) or roche failed
(with --json, roche's own failure exits 1 with a JSON error line). Ctrl-C detaches:
the command goes on, and roche prints the offsets to resume from. --json prints JSON
lines: {"start": {"pid", "stdout_offset", "stderr_offset"}}, then {"stream", "offset",
"data" (base64)} for each piece, and {"end": {"exit_code", "signal", "unknown", ...}}.`,
		Example: `  pid=$(roche exec --sandbox "$id" --background --tag server -- python3 -m http.server 8000)
  roche commands list --sandbox "$id"
  roche commands connect --sandbox "$id" "$pid"                       # replay, then follow
  roche commands connect --sandbox "$id" --tag server --stdout-offset 4096
  roche exec --sandbox "$id" -d --keep-stdin -- python3 -i
  echo 'print(1 + 1)' | roche commands send-stdin --sandbox "$id" "$pid"
  roche commands kill --sandbox "$id" --tag server`,
	}
	c.PersistentFlags().StringVar(&id, "sandbox", "", "id of the sandbox (required)")

	var asJSON bool
	list := &cobra.Command{
		Use:   "list --sandbox ID [--json]",
		Short: "List a sandbox's background commands, running or ended (the last 64 ended are kept)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := e.runner(id)
			if err != nil {
				return err
			}
			list, err := r.Commands(cmd.Context(), id)
			if err != nil {
				return friendly(err)
			}
			if asJSON {
				if list == nil {
					list = []roche.Command{}
				}
				return e.printJSON(list)
			}
			w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PID\tTAG\tSTATE\tSTDOUT\tSTDERR\tCOMMAND")
			for _, c := range list {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", c.PID, dashIfEmpty(c.Tag), commandState(c),
					keptRange(c.First.Stdout, c.Written.Stdout), keptRange(c.First.Stderr, c.Written.Stderr), strings.Join(c.Cmd, " "))
			}
			return w.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of the commands")

	var from roche.CommandOffsets
	var events bool
	connect := &cobra.Command{
		Use:   "connect --sandbox ID [PID] [--tag NAME] [--stdout-offset N] [--stderr-offset N] [--json]",
		Short: "Replay a background command's output from byte offsets, follow it, and exit with its status",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := selector(args, tag)
			if err == nil {
				var r roche.BackgroundRunner
				if r, err = e.runner(id); err == nil {
					return e.connectCommand(cmd.Context(), r, id, sel, from, events)
				}
			}
			if events {
				return err // as JSON, for programs (roche's own exit status 1)
			}
			return e.rocheFailed(err)
		},
	}
	connect.Flags().Int64Var(&from.Stdout, "stdout-offset", 0, "where in stdout to start (a byte offset; -1: only what comes next)")
	connect.Flags().Int64Var(&from.Stderr, "stderr-offset", 0, "where in stderr to start (a byte offset; -1: only what comes next)")
	connect.Flags().BoolVar(&events, "json", false, "print JSON lines (see roche commands --help) instead of the output itself")

	var closeAfter bool
	sendStdin := &cobra.Command{
		Use:   "send-stdin --sandbox ID [PID] [--tag NAME] [DATA]",
		Short: "Send DATA (or roche's standard input, when none is given) to a command started with --keep-stdin",
		Args:  cobra.MaximumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var data io.Reader = e.stdin
			if (tag == "" && len(args) == 2) || (tag != "" && len(args) == 1) {
				data = strings.NewReader(args[len(args)-1])
				args = args[:len(args)-1]
			}
			sel, err := selector(args, tag)
			if err != nil {
				return err
			}
			r, err := e.runner(id)
			if err != nil {
				return err
			}
			if err := e.sendInput(cmd.Context(), r, id, sel, data); err != nil {
				return err
			}
			if closeAfter {
				return friendly(r.CloseCommandInput(cmd.Context(), id, sel))
			}
			return nil
		},
	}
	sendStdin.Flags().BoolVar(&closeAfter, "close", false, "close the command's stdin after sending")

	closeStdin := &cobra.Command{
		Use:   "close-stdin --sandbox ID [PID] [--tag NAME]",
		Short: "Close a command's stdin: it reads end of file from then on",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := selector(args, tag)
			if err != nil {
				return err
			}
			r, err := e.runner(id)
			if err != nil {
				return err
			}
			return friendly(r.CloseCommandInput(cmd.Context(), id, sel))
		},
	}

	kill := &cobra.Command{
		Use:   "kill --sandbox ID [PID] [--tag NAME]",
		Short: "Kill a command and everything it started (SIGKILL to its process group)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := selector(args, tag)
			if err != nil {
				return err
			}
			r, err := e.runner(id)
			if err != nil {
				return err
			}
			return friendly(r.SignalCommand(cmd.Context(), id, sel, int(syscall.SIGKILL)))
		},
	}

	signal := &cobra.Command{
		Use:   "signal --sandbox ID [PID] [--tag NAME] SIGNAL",
		Short: "Send a signal (TERM, INT, HUP, KILL or a number) to a command's process group",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sig, err := signalNumber(args[len(args)-1])
			if err != nil {
				return err
			}
			sel, err := selector(args[:len(args)-1], tag)
			if err != nil {
				return err
			}
			r, err := e.runner(id)
			if err != nil {
				return err
			}
			return friendly(r.SignalCommand(cmd.Context(), id, sel, sig))
		},
	}
	for _, sub := range []*cobra.Command{connect, sendStdin, closeStdin, kill, signal} {
		sub.Flags().StringVar(&tag, "tag", "", "name the command by the tag it was started with instead of its pid")
	}
	c.AddCommand(list, connect, sendStdin, closeStdin, kill, signal)
	return c
}

// connectCommand follows a command to its end, as output or JSON lines, and returns
// the exit status roche exits with.
func (e *env) connectCommand(ctx context.Context, r roche.BackgroundRunner, id string, sel roche.CommandSelector, from roche.CommandOffsets, events bool) error {
	next := from
	enc := json.NewEncoder(e.stdout)
	end, err := r.ConnectCommand(ctx, id, sel, from, roche.CommandOutput{
		Started: func(st roche.CommandStart) {
			next = st.From
			if events {
				_ = enc.Encode(commandEvent{Start: &commandStartJSON{PID: st.PID, Tag: st.Tag, StdoutOffset: st.From.Stdout, StderrOffset: st.From.Stderr}})
			}
		},
		Data: func(s roche.Stream, off int64, data []byte) error {
			var err error
			switch {
			case events:
				err = enc.Encode(commandEvent{Stream: s.String(), Offset: &off, Data: data})
			case s == roche.StreamStderr:
				_, err = e.stderr.Write(data)
			default:
				_, err = e.stdout.Write(data)
			}
			if s == roche.StreamStderr {
				next.Stderr = off + int64(len(data))
			} else {
				next.Stdout = off + int64(len(data))
			}
			return err
		},
	})
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(e.stderr, "roche: detached; the command goes on (resume with --stdout-offset %d --stderr-offset %d)\n", next.Stdout, next.Stderr)
			return interruptCode(ctx)
		}
		if events {
			return friendly(err) // as JSON, for programs (roche's own exit status 1)
		}
		return e.rocheFailed(friendly(err))
	}
	if events {
		if err := enc.Encode(commandEvent{End: &end}); err != nil {
			return err
		}
	}
	switch {
	case end.Unknown != "":
		fmt.Fprintf(e.stderr, "roche: the command's exit status is unknown: %s\n", end.Unknown)
		return exitCode(exitRocheFailed)
	case end.ExitCode != 0:
		if !events && end.TimedOut {
			fmt.Fprintln(e.stderr, "roche: the command timed out")
		}
		return exitCode(end.ExitCode)
	}
	return nil
}

func commandState(c roche.Command) string {
	switch {
	case c.Running:
		return "running " + time.Since(c.StartedAt).Round(time.Second).String()
	case c.End == nil:
		return "ended"
	case c.End.Unknown != "":
		return "ended, status unknown"
	case c.End.Signal != 0:
		return fmt.Sprintf("killed by %s", strings.TrimPrefix(unixSignalName(syscall.Signal(c.End.Signal)), "SIG"))
	}
	return fmt.Sprintf("exited %d", c.End.ExitCode)
}

// keptRange says which bytes of a stream are kept: all of them, or from an offset.
func keptRange(first, written int64) string {
	if first == 0 {
		return size.String(written)
	}
	return fmt.Sprintf("%s (from %d)", size.String(written), first)
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
