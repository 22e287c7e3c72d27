package roche

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/roche-sandbox/roche/internal/size"
)

// CodeRunner runs code in contexts: long-lived interpreters inside a sandbox that keep
// their variables from one call to the next, as E2B's code interpreter does. A context
// runs as the sandbox user under every limit of its sandbox. Providers whose sandboxes
// run Python implement it; Capabilities.Code lists the languages.
type CodeRunner interface {
	// RunCode runs req.Code in a context and waits for it. The code's failure (an
	// exception, a timeout, the interpreter dying) is in Execution.Error, not an error;
	// errors mean the code could not be run (no such sandbox or context, a language the
	// sandbox has no interpreter for).
	RunCode(ctx context.Context, id string, req CodeRequest) (Execution, error)
	// CreateContext starts a new context.
	CreateContext(ctx context.Context, id string, opts ContextOptions) (CodeContext, error)
	// Contexts lists the sandbox's contexts.
	Contexts(ctx context.Context, id string) ([]CodeContext, error)
	// RestartContext replaces a context's interpreter with a fresh one (its variables go).
	RestartContext(ctx context.Context, id, contextID string) error
	// RemoveContext stops a context's interpreter and forgets it.
	RemoveContext(ctx context.Context, id, contextID string) error
}

// ContextForker is a CodeRunner whose interpreters can fork themselves: a context's fork
// is a new context in the same sandbox holding a copy of its variables, for agents that
// branch their work. Providers whose code contexts run in roche-agent implement it;
// wasm's (python.wasm, WASI has no fork) do not.
type ContextForker interface {
	// ForkContext makes a new context holding a copy of context contextID's interpreter
	// (waiting for a cell running in it to end); the two go on apart. Only the thread
	// running the kernel is copied, as with os.fork.
	ForkContext(ctx context.Context, id, contextID string) (CodeContext, error)
}

// Code languages.
const (
	LanguagePython = "python"
	LanguageBash   = "bash"
	// LanguageJavaScript runs in node, where the sandbox's image has it.
	LanguageJavaScript = "javascript"
)

// DefaultCodeTimeout bounds a call to RunCode that gives no timeout.
const DefaultCodeTimeout = 5 * time.Minute

// Limits of a code request: the code (not its output, which OutputLimit caps).
const MaxCodeBytes = 1 << 20

// ContextOptions makes a context.
type ContextOptions struct {
	// Language is the interpreter; empty means LanguagePython.
	Language string `json:"language,omitempty"`
	// Cwd is the interpreter's working directory; empty means the sandbox's workdir.
	Cwd string `json:"cwd,omitempty"`
	// Env is added to the sandbox's environment for the interpreter.
	Env map[string]string `json:"env,omitempty"`
}

// CodeContext describes a context.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd,omitempty"`
	// Default: this is the language's default context, used when a request names none.
	Default bool `json:"default,omitempty"`
}

// CodeRequest is one cell of code.
type CodeRequest struct {
	// Code is the source; it may be empty (the execution then has nothing in it).
	Code string
	// Language selects the default context when Context is empty; empty means
	// LanguagePython. With Context set it must be empty or that context's language.
	Language string
	// Context names the context; empty means the language's default context, started
	// on first use.
	Context string
	// Env and Cwd start the default context, when this call starts it: as
	// ContextOptions' (roched passes what a pooled sandbox's create asked for).
	Env map[string]string
	Cwd string
	// Timeout interrupts the cell (KeyboardInterrupt in Python) after this long; the
	// context survives with its variables. Zero means DefaultCodeTimeout.
	Timeout time.Duration
	// Stdout and Stderr, when set, receive output as it is produced, in addition to the
	// copy kept in Execution.Logs.
	Stdout io.Writer
	Stderr io.Writer
	// OutputLimit caps each stream's kept bytes; zero means DefaultOutputLimit.
	OutputLimit int64
	// OnResult, when set, receives each rich result as it is produced, in addition to
	// the copy kept in Execution.Results.
	OnResult func(CodeResult)
}

// Validate refuses a request no provider should run, with the reason.
func (r CodeRequest) Validate() error {
	var problems []string
	if len(r.Code) > MaxCodeBytes {
		problems = append(problems, fmt.Sprintf("code of %s is over the limit of %s: copy it in as a file and run that instead",
			size.String(int64(len(r.Code))), size.String(MaxCodeBytes)))
	}
	if r.Timeout < 0 {
		problems = append(problems, fmt.Sprintf("negative code timeout %s", r.Timeout))
	}
	if r.OutputLimit < 0 || r.OutputLimit > MaxOutputLimit {
		problems = append(problems, fmt.Sprintf("output_limit %d: give 0 (the default) up to %s", r.OutputLimit, size.String(MaxOutputLimit)))
	}
	problems = append(problems, ContextOptions{Language: r.Language, Cwd: r.Cwd, Env: r.Env}.problems()...)
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
	}
	return nil
}

// Validate refuses options no provider should start a context with.
func (o ContextOptions) Validate() error {
	if problems := o.problems(); len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
	}
	return nil
}

func (o ContextOptions) problems() []string {
	var problems []string
	if err := checkLanguage(o.Language); err != nil {
		problems = append(problems, strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": "))
	}
	if o.Cwd != "" && !path.IsAbs(o.Cwd) {
		problems = append(problems, fmt.Sprintf("cwd %q is not absolute: give a path starting with /", o.Cwd))
	} else if len(o.Cwd) > MaxPathBytes {
		problems = append(problems, fmt.Sprintf("cwd is %d bytes, over the limit of %d", len(o.Cwd), MaxPathBytes))
	}
	return append(problems, envProblems("env", o.Env)...)
}

// checkLanguage refuses a language name Roche has no contexts for; empty is Python.
func checkLanguage(lang string) error {
	switch lang {
	case "", LanguagePython, LanguageBash, LanguageJavaScript:
		return nil
	}
	return fmt.Errorf("%w: unknown code language %q: use %q, %q or %q", ErrInvalidConfig, lang, LanguagePython, LanguageBash, LanguageJavaScript)
}

// Execution is the outcome of a cell, shaped like E2B's Execution.
type Execution struct {
	// Results holds the cell's rich results in order: display calls, figures left
	// open, and last the value of the last expression (IsMainResult).
	Results []CodeResult `json:"results,omitempty"`
	Logs    CodeLogs     `json:"logs"`
	// Error is the exception that ended the cell, if any.
	Error *CodeError `json:"error,omitempty"`
	// ExecutionCount counts the cells the context has run, this one included.
	ExecutionCount int `json:"execution_count"`
	// Context is the context that ran the cell.
	Context string `json:"context"`
	// TimedOut: the cell was interrupted at its timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// Restarted: the context's interpreter had died (os._exit, the memory limit), or
	// lived in another process this one cannot reach (a wasm context of an earlier
	// direct-mode roche command), and a fresh one, without the old variables, ran this
	// cell.
	Restarted bool `json:"restarted,omitempty"`
	// Truncated: a log stream passed the output limit and was cut.
	Truncated bool          `json:"truncated,omitempty"`
	Duration  time.Duration `json:"duration_ns"`
}

// Text is the main result's text: the value of the cell's last expression.
func (e Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// CodeLogs is what a cell printed, in the chunks it was produced in.
type CodeLogs struct {
	Stdout []string `json:"stdout"`
	Stderr []string `json:"stderr"`
}

// CodeResult is one rich result; each field is set when the result has that form.
type CodeResult struct {
	Text       string `json:"text,omitempty"`       // text/plain
	HTML       string `json:"html,omitempty"`       // text/html (a DataFrame)
	Markdown   string `json:"markdown,omitempty"`   // text/markdown
	SVG        string `json:"svg,omitempty"`        // image/svg+xml
	PNG        []byte `json:"png,omitempty"`        // image/png
	JPEG       []byte `json:"jpeg,omitempty"`       // image/jpeg
	JSON       string `json:"json,omitempty"`       // application/json, as JSON text
	LaTeX      string `json:"latex,omitempty"`      // text/latex
	JavaScript string `json:"javascript,omitempty"` // application/javascript
	// IsMainResult: the value of the cell's last expression, not a display call.
	IsMainResult bool `json:"is_main_result,omitempty"`
}

// CodeError is an exception that ended a cell.
type CodeError struct {
	Name      string `json:"name"`      // e.g. "ZeroDivisionError", "KeyboardInterrupt"
	Value     string `json:"value"`     // e.g. "division by zero"
	Traceback string `json:"traceback"` // the formatted traceback
}

func (e *CodeError) Error() string { return e.Name + ": " + e.Value }
