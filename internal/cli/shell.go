package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/cli/cliflag"
)

func (e *env) shellCommand() *cobra.Command {
	var envs []string
	var workdir string
	c := &cobra.Command{
		Use:   "shell ID [-- CMD [ARGS...]]",
		Short: "Open an interactive terminal in a sandbox",
		Long: `Open an interactive terminal in a sandbox, as docker exec -it does: the command
(default: the image's shell, /bin/bash else /bin/sh) runs on a pseudo-terminal as the
sandbox user under every limit of the sandbox. Your terminal is put in raw mode, so
every key (Ctrl-C, Ctrl-D, Ctrl-Z) goes to the program in the sandbox; window size
changes follow. roche exits with the command's exit status and restores your terminal.
When standard input is not a terminal, it is typed in as it comes, without raw mode,
and its end is the end of input: from then on the program reads Ctrl-D each time it
waits for input, so echo 'echo hi' | roche shell ID runs the command and exits.
Works direct and through roched; wasm sandboxes have no terminals.`,
		Example: `  roche shell "$id"
  roche shell "$id" -- python3`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			id, argv := args[0], args[1:]
			if n := cmd.ArgsLenAtDash(); n > 1 || (n < 0 && len(args) > 1) {
				return e.rocheFailed(fmt.Errorf("roche shell takes one sandbox id, then the command after --, e.g. roche shell %s -- python3", id))
			}
			env, err := cliflag.ParseEnv(envs)
			if err != nil {
				return e.rocheFailed(err)
			}
			p, err := e.providers.forID(id)
			if err != nil {
				return e.rocheFailed(err)
			}
			t, ok := p.(roche.Terminal)
			if !ok {
				return e.rocheFailed(fmt.Errorf("%w: the %s provider has no terminals (its sandboxes are not Linux process trees); use roche exec", roche.ErrUnsupported, p.Name()))
			}
			req := roche.TerminalRequest{Cmd: argv, Env: env, Workdir: workdir}
			tio := roche.TerminalIO{Stdin: e.stdin, Output: e.stdout}
			if in, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(in.Fd())) {
				state, err := term.MakeRaw(int(in.Fd()))
				if err != nil {
					return e.rocheFailed(fmt.Errorf("putting the terminal in raw mode: %w", err))
				}
				// Every way out (an error, a signal's cancel, the shell's exit) passes here.
				defer term.Restore(int(in.Fd()), state)
				req.Size = windowSize(in)
				resize, stop := watchWindow(in)
				defer stop()
				tio.Resize = resize
			}
			// Piped input's end is the end of input: the program reads Ctrl-D each time
			// it waits for more, so a shell fed commands exits after the last one.
			code, err := t.Shell(ctx, id, req, tio)
			if err != nil {
				if ctx.Err() != nil {
					return interruptCode(ctx)
				}
				return e.rocheFailed(errors.New(oneLine(friendly(e.directHint(err)))))
			}
			if code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	c.Flags().StringArrayVar(&envs, "env", nil, "set an environment variable in the shell, KEY=VALUE (repeatable)")
	c.Flags().StringVar(&workdir, "workdir", "", "working directory of the shell")
	return c
}

// windowSize is the terminal's size, or zero (80×24 in the sandbox) if it cannot be read.
func windowSize(f *os.File) roche.TerminalSize {
	w, h, err := term.GetSize(int(f.Fd()))
	if err != nil || w <= 0 || h <= 0 {
		return roche.TerminalSize{}
	}
	return roche.TerminalSize{Cols: uint16(min(w, roche.MaxTerminalSide)), Rows: uint16(min(h, roche.MaxTerminalSide))}
}
