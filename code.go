package roche

import (
	"context"
	"fmt"
	"io"
	"time"
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

// Code languages.
const (
	LanguagePython = "python"
	LanguageBash   = "bash"
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
	// Timeout interrupts the cell (KeyboardInterrupt in Python) after this long; the
	// context survives with its variables. Zero means DefaultCodeTimeout.
	Timeout time.Duration
	// Stdout and Stderr, when set, receive output as it is produced, in addition to the
	// copy kept in Execution.Logs.
	Stdout io.Writer
	Stderr io.Writer
	// OutputLimit caps each stream's kept bytes; zero means DefaultOutputLimit.
	OutputLimit int64
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
	// Restarted: the context's interpreter had died (os._exit, the memory limit) and a
	// fresh one, without the old variables, ran this cell.
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

// Validate checks a request's code and language (a provider may still refuse a language
// its sandboxes have no interpreter for).
func (r CodeRequest) Validate() error {
	if len(r.Code) > MaxCodeBytes {
		return fmt.Errorf("%w: code of %d bytes is over the %d-byte limit", ErrInvalidConfig, len(r.Code), MaxCodeBytes)
	}
	if r.Timeout < 0 {
		return fmt.Errorf("%w: negative code timeout %s", ErrInvalidConfig, r.Timeout)
	}
	if r.OutputLimit < 0 {
		return fmt.Errorf("%w: negative output limit %d", ErrInvalidConfig, r.OutputLimit)
	}
	return nil
}
