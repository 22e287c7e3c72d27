package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/wire"
)

// coder finds sandbox id's provider and its code contexts.
func (e *env) coder(id string) (roche.CodeRunner, error) {
	if id == "" {
		return nil, errors.New("no sandbox given: pass --sandbox ID (roche list shows them)")
	}
	p, err := e.providers.forID(id)
	if err != nil {
		return nil, err
	}
	cr, ok := p.(roche.CodeRunner)
	if !ok || len(p.Capabilities().Code) == 0 {
		return nil, fmt.Errorf("the %s provider has no code contexts: run the code with roche exec instead", p.Name())
	}
	return cr, nil
}

func (e *env) codeCommand() *cobra.Command {
	var id, contextID, language, outDir string
	var timeout float64
	var asJSON, events bool
	c := &cobra.Command{
		Use:   "code --sandbox ID [flags] [CODE]",
		Short: "Run code in a sandbox's interpreter, keeping its state between calls",
		Long: `Run a cell of code in a context: a long-lived interpreter inside the sandbox that keeps
its variables from one call to the next, like a notebook. On wasm the interpreter lives
in the process that runs it: a sandbox made through roched keeps its contexts between
calls, but without roched each roche code is a process of its own, so each call starts
a fresh interpreter, says so on standard error and sets restarted (--json). The code is the argument, or
standard input when there is none. Output streams as it is produced; the value of the
last expression is printed as the interpreter would; rich results (a matplotlib figure, a
DataFrame) are named on standard error, and written as files to --out DIR. An exception
prints its traceback and exits 1; a timeout interrupts the cell (its variables stay) and
exits 124. --json prints the whole execution (results, logs, error, execution_count);
--json-events prints JSON lines as the cell runs ({"stream":"stdout","data":BASE64},
{"result":{...}}) and {"execution":{...}} last, for programs that stream. Without --context the language's default context is used, started on first use; roche
context manages others.`,
		Example: `  roche code --sandbox "$id" 'x = 41'
  roche code --sandbox "$id" 'x + 1'                       # prints 42
  echo 'import math; math.pi' | roche code --sandbox "$id" --json
  roche code --sandbox "$id" --out charts 'import matplotlib.pyplot as plt; plt.plot([1, 3, 2])'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cr, err := e.coder(id)
			if err != nil {
				return e.rocheFailed(err)
			}
			var code string
			if len(args) == 1 {
				code = args[0]
			} else {
				if f, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					return e.rocheFailed(errors.New("no code given: pass it as the argument, or pipe it to standard input"))
				}
				b, err := io.ReadAll(io.LimitReader(e.stdin, roche.MaxCodeBytes+1))
				if err != nil {
					return e.rocheFailed(fmt.Errorf("reading code from standard input: %w", err))
				}
				code = string(b)
			}
			t, err := wire.ExecTimeout(timeout)
			if err != nil {
				return e.rocheFailed(friendly(err))
			}
			req := roche.CodeRequest{Code: code, Language: language, Context: contextID, Timeout: t}
			if events {
				return e.rocheFailed(e.runCodeEvents(cmd.Context(), cr, id, req))
			}
			if !asJSON {
				req.Stdout, req.Stderr = e.stdout, e.stderr
			}
			return e.rocheFailed(e.runCode(cmd.Context(), cr, id, req, asJSON, outDir))
		},
	}
	c.Flags().StringVar(&id, "sandbox", "", "id of the sandbox to run in (required)")
	c.Flags().StringVar(&contextID, "context", "", "context to run in (default: the language's default context)")
	c.Flags().StringVar(&language, "language", "", "language of the default context: python (default), bash or javascript, where the sandbox has it")
	c.Flags().Float64Var(&timeout, "timeout", 0, "interrupt the cell after this many seconds; the context keeps its variables (default 300)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the execution as JSON (results with png as base64, logs, error, execution_count)")
	c.Flags().BoolVar(&events, "json-events", false, "print output and results as JSON lines while the cell runs, then the execution (for the SDKs)")
	c.Flags().StringVar(&outDir, "out", "", "write rich results into this directory (result-N.png, .svg, .html, .json)")
	return c
}

// restartedNote says why a cell ran in a fresh interpreter.
func restartedNote(cr roche.CodeRunner) string {
	_, viaRoched := cr.(*client.Provider)
	if p, ok := cr.(roche.Provider); ok && p.Name() == "wasm" && !viaRoched {
		return "this cell ran in a fresh interpreter, without the variables of earlier calls: on wasm a context lives in the process " +
			"that runs it, and without roched each roche command is a process of its own (or the interpreter had died at a timeout); " +
			"a wasm sandbox created through roched (roche daemon start) keeps its contexts between calls"
	}
	return "the context's interpreter had died: this cell ran in a fresh one, without the old variables"
}

// runCode runs one cell and reports it as roche code does.
func (e *env) runCode(ctx context.Context, cr roche.CodeRunner, id string, req roche.CodeRequest, asJSON bool, outDir string) error {
	ex, err := cr.RunCode(ctx, id, req)
	if err != nil {
		if ctx.Err() != nil {
			return interruptCode(ctx)
		}
		return fmt.Errorf("%s", oneLine(friendly(e.directHint(err))))
	}
	if outDir != "" {
		if err := writeResults(outDir, ex.Results); err != nil {
			return err
		}
	}
	if asJSON {
		if err := e.printJSON(ex); err != nil {
			return err
		}
	} else {
		if ex.Restarted {
			fmt.Fprintf(e.stderr, "roche: %s\n", restartedNote(cr))
		}
		for i, r := range ex.Results {
			if kinds := richKinds(r); len(kinds) > 0 {
				where := "use --out DIR or --json to get it"
				if outDir != "" {
					where = "written to " + outDir
				}
				fmt.Fprintf(e.stderr, "roche: result %d: %s (%s)\n", i+1, strings.Join(kinds, ", "), where)
			}
			if r.IsMainResult && r.Text != "" {
				fmt.Fprintln(e.stdout, r.Text)
			}
		}
		if ex.Error != nil {
			tb := strings.TrimRight(ex.Error.Traceback, "\n")
			if tb == "" {
				tb = ex.Error.Error()
			}
			fmt.Fprintln(e.stderr, tb)
		}
		if ex.Truncated {
			fmt.Fprintf(e.stderr, "roche: output truncated: a stream passed %d bytes\n", roche.DefaultOutputLimit)
		}
		if ex.TimedOut {
			limit := req.Timeout
			if limit <= 0 {
				limit = roche.DefaultCodeTimeout
			}
			kept := "the context keeps its variables"
			if ex.Error != nil && ex.Error.Name == "TimeoutError" {
				kept = "its interpreter was stopped, and the next cell starts a fresh one"
			}
			fmt.Fprintf(e.stderr, "roche: the cell timed out: its %s limit (--timeout) interrupted it after it ran %s; %s\n", limit, ex.Duration.Round(time.Millisecond), kept)
		}
	}
	switch {
	case ex.TimedOut:
		return exitCode(exitCodeTimeout)
	case ex.Error != nil:
		return exitCode(1)
	}
	return nil
}

// codeEvents writes roche code --json-events' lines, one at a time: output and results
// arrive from the provider's goroutines.
type codeEvents struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (c *codeEvents) emit(v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.enc.Encode(v)
}

type codeStream struct {
	c      *codeEvents
	stream string
}

// Write sends a chunk as base64, so that a character split across chunks survives.
func (s codeStream) Write(p []byte) (int, error) {
	s.c.emit(struct {
		Stream string `json:"stream"`
		Data   []byte `json:"data"`
	}{s.stream, p})
	return len(p), nil
}

// runCodeEvents runs one cell for roche code --json-events.
func (e *env) runCodeEvents(ctx context.Context, cr roche.CodeRunner, id string, req roche.CodeRequest) error {
	ev := &codeEvents{enc: json.NewEncoder(e.stdout)}
	req.Stdout, req.Stderr = codeStream{ev, "stdout"}, codeStream{ev, "stderr"}
	req.OnResult = func(r roche.CodeResult) { ev.emit(map[string]any{"result": r}) }
	ex, err := cr.RunCode(ctx, id, req)
	if err != nil {
		if ctx.Err() != nil {
			return interruptCode(ctx)
		}
		return fmt.Errorf("%s", oneLine(friendly(e.directHint(err))))
	}
	ev.emit(map[string]any{"execution": ex})
	switch {
	case ex.TimedOut:
		return exitCode(exitCodeTimeout)
	case ex.Error != nil:
		return exitCode(1)
	}
	return nil
}

// richKinds names the forms of a result beyond text.
func richKinds(r roche.CodeResult) []string {
	var k []string
	for _, f := range []struct {
		set  bool
		name string
	}{
		{len(r.PNG) > 0, "image/png"}, {len(r.JPEG) > 0, "image/jpeg"}, {r.SVG != "", "image/svg+xml"},
		{r.HTML != "", "text/html"}, {r.JSON != "", "application/json"}, {r.Markdown != "", "text/markdown"},
		{r.LaTeX != "", "text/latex"}, {r.JavaScript != "", "application/javascript"},
	} {
		if f.set {
			k = append(k, f.name)
		}
	}
	return k
}

// writeResults writes each rich result's forms as result-N.EXT in dir.
func writeResults(dir string, results []roche.CodeResult) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making --out directory: %w", err)
	}
	for i, r := range results {
		for ext, b := range map[string][]byte{
			"png": r.PNG, "jpeg": r.JPEG, "svg": []byte(r.SVG), "html": []byte(r.HTML), "json": []byte(r.JSON),
			"md": []byte(r.Markdown), "tex": []byte(r.LaTeX), "js": []byte(r.JavaScript),
		} {
			if len(b) == 0 {
				continue
			}
			name := filepath.Join(dir, fmt.Sprintf("result-%d.%s", i+1, ext))
			if err := os.WriteFile(name, b, 0o644); err != nil {
				return fmt.Errorf("writing a result: %w", err)
			}
		}
	}
	return nil
}

func (e *env) contextCommand() *cobra.Command {
	var id string
	c := &cobra.Command{
		Use:   "context create|list|restart|fork|rm --sandbox ID",
		Short: "Manage a sandbox's code contexts (interpreters that keep state; see roche code)",
		Long: `A context is a long-lived interpreter in a sandbox, run as the sandbox user under
every limit. roche code uses a language's default context unless given --context; create
makes more (each with its own variables), restart replaces one's interpreter with a fresh
one, fork starts a new one holding a copy of one's variables, rm stops it.`,
		Example: `  ctx=$(roche context create --sandbox "$id")
  roche code --sandbox "$id" --context "$ctx" 'y = 1'
  branch=$(roche context fork --sandbox "$id" "$ctx")
  roche context list --sandbox "$id"
  roche context rm --sandbox "$id" "$ctx"`,
	}
	c.PersistentFlags().StringVar(&id, "sandbox", "", "id of the sandbox (required)")
	var language, cwd string
	create := &cobra.Command{
		Use:   "create --sandbox ID [--language python|bash|javascript] [--cwd DIR]",
		Short: "Start a new context and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cr, err := e.coder(id)
			if err != nil {
				return err
			}
			cc, err := cr.CreateContext(cmd.Context(), id, roche.ContextOptions{Language: language, Cwd: cwd})
			if err != nil {
				return friendly(err)
			}
			fmt.Fprintln(e.stdout, cc.ID)
			return nil
		},
	}
	create.Flags().StringVar(&language, "language", "", "python (default), bash or javascript, where the sandbox has it")
	create.Flags().StringVar(&cwd, "cwd", "", "the interpreter's working directory (default: the sandbox's workdir)")
	var asJSON bool
	list := &cobra.Command{
		Use:   "list --sandbox ID [--json]",
		Short: "List a sandbox's contexts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cr, err := e.coder(id)
			if err != nil {
				return err
			}
			cs, err := cr.Contexts(cmd.Context(), id)
			if err != nil {
				return err
			}
			if asJSON {
				if cs == nil {
					cs = []roche.CodeContext{}
				}
				return e.printJSON(cs)
			}
			w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tLANGUAGE\tCWD\tDEFAULT")
			for _, cc := range cs {
				fmt.Fprintf(w, "%s\t%s\t%s\t%v\n", cc.ID, cc.Language, cc.Cwd, cc.Default)
			}
			return w.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the contexts as JSON")
	restart := &cobra.Command{
		Use:   "restart --sandbox ID CONTEXT",
		Short: "Replace a context's interpreter with a fresh one (its variables go)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cr, err := e.coder(id)
			if err != nil {
				return err
			}
			return cr.RestartContext(cmd.Context(), id, args[0])
		},
	}
	fork := &cobra.Command{
		Use:   "fork --sandbox ID CONTEXT",
		Short: "Start a new context holding a copy of a context's variables, and print its id",
		Long: `fork makes a new context in the same sandbox whose interpreter is a copy of
CONTEXT's (it forks itself): the same variables, imports and open files, after which the
two go on apart. Only the interpreter's main thread is copied, as with os.fork. wasm
sandboxes cannot (python.wasm has no fork).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cr, err := e.coder(id)
			if err != nil {
				return err
			}
			fk, ok := cr.(roche.ContextForker)
			if !ok {
				return fmt.Errorf("%w: this provider's interpreters cannot fork themselves (python.wasm: WASI has no fork): create a context and run its cells again", roche.ErrUnsupported)
			}
			cc, err := fk.ForkContext(cmd.Context(), id, args[0])
			if err != nil {
				return friendly(err)
			}
			fmt.Fprintln(e.stdout, cc.ID)
			return nil
		},
	}
	rm := &cobra.Command{
		Use:   "rm --sandbox ID CONTEXT...",
		Short: "Stop contexts and forget them",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cr, err := e.coder(id)
			if err != nil {
				return err
			}
			for _, a := range args {
				if err := cr.RemoveContext(cmd.Context(), id, a); err != nil {
					return err
				}
			}
			return nil
		},
	}
	c.AddCommand(create, list, restart, fork, rm)
	return c
}
