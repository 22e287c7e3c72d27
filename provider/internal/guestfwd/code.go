package guestfwd

import (
	"context"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
)

// CodeLanguages are the languages roche-agent's contexts serve.
var CodeLanguages = []string{roche.LanguagePython}

// interruptSlack covers the agent's grace between interrupting a cell at its timeout
// and killing its interpreter, and the time to start an interpreter.
const interruptSlack = 30 * time.Second

var _ roche.CodeRunner = Forwarder{}

// RunCode implements roche.CodeRunner.
func (f Forwarder) RunCode(ctx context.Context, id string, req roche.CodeRequest) (roche.Execution, error) {
	if err := req.Validate(); err != nil {
		return roche.Execution{}, err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return roche.Execution{}, err
	}
	return t.RunCode(ctx, req)
}

// RunCode runs a cell through the agent, which interrupts it at its timeout inside the
// sandbox; ctx ending closes the connection, which interrupts it too.
func (t Target) RunCode(ctx context.Context, req roche.CodeRequest) (roche.Execution, error) {
	cell := NewCell(req)
	if cell.Request.Cwd == "" {
		cell.Request.Cwd = t.Workdir
	}
	timeout := time.Duration(cell.Request.TimeoutMS) * time.Millisecond
	actx, cancel := context.WithTimeout(ctx, timeout+interruptSlack+answerSlack)
	defer cancel()
	cell.Request.TraceParent = traceParent(ctx)
	end, err := t.Agent.RunCode(actx, cell.Request, guest.CodeOptions{Stdout: cell.Stdout, Stderr: cell.Stderr, Result: cell.Result})
	agentSpans(ctx, end.Spans)
	if err != nil {
		if ctx.Err() != nil {
			return roche.Execution{}, fmt.Errorf("running code in sandbox %s: %w", t.ID, ctx.Err())
		}
		if actx.Err() != nil {
			return roche.Execution{}, fmt.Errorf("%w: sandbox %s did not answer within the cell's timeout: is it paused? (roche unpause %s)", roche.ErrTimeout, t.ID, t.ID)
		}
		return roche.Execution{}, t.fail(err)
	}
	return cell.Execution(end), nil
}

// Cell is one cell of code on its way to a code context (roche-agent's, or the wasm
// provider's, which runs the same internal/guest/codectx): the agent's request for it
// and what keeps its output for its Execution.
type Cell struct {
	// Request is the code_run request: its timeout and output limit made explicit, Cwd
	// as the caller gave it.
	Request        guest.Request
	Stdout, Stderr *kit.LogCapture
	results        []roche.CodeResult
	onResult       func(roche.CodeResult)
}

// NewCell returns the cell of req.
func NewCell(req roche.CodeRequest) *Cell {
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = roche.DefaultCodeTimeout
	}
	limit := req.OutputLimit
	if limit <= 0 {
		limit = roche.DefaultOutputLimit
	}
	return &Cell{
		Request: guest.Request{
			Code: req.Code, Language: req.Language, Context: req.Context, Cwd: req.Cwd, Env: req.Env,
			TimeoutMS: timeout.Milliseconds(), OutputLimit: limit,
		},
		Stdout:   kit.NewLogCapture(limit, req.Stdout),
		Stderr:   kit.NewLogCapture(limit, req.Stderr),
		onResult: req.OnResult,
	}
}

// Result keeps a rich result of the cell and passes it on.
func (c *Cell) Result(r guest.CodeResult) {
	res := CodeResult(r)
	c.results = append(c.results, res)
	if c.onResult != nil {
		c.onResult(res)
	}
}

// Execution is the core's outcome of the cell, which ended with end.
func (c *Cell) Execution(end guest.CodeEnd) roche.Execution {
	ex := roche.Execution{
		Results:        c.results,
		Logs:           roche.CodeLogs{Stdout: c.Stdout.Chunks(), Stderr: c.Stderr.Chunks()},
		ExecutionCount: end.ExecutionCount,
		Context:        end.Context,
		TimedOut:       end.TimedOut,
		Restarted:      end.Restarted,
		Truncated:      end.Truncated || c.Stdout.Truncated() || c.Stderr.Truncated(),
		Duration:       time.Duration(end.DurationNS),
	}
	if ex.Logs.Stdout == nil {
		ex.Logs.Stdout = []string{}
	}
	if ex.Logs.Stderr == nil {
		ex.Logs.Stderr = []string{}
	}
	if end.Error != nil {
		ex.Error = &roche.CodeError{Name: end.Error.Name, Value: end.Error.Value, Traceback: end.Error.Traceback}
	}
	return ex
}

// CodeResult turns the kernel's MIME bundle into the core's result.
func CodeResult(r guest.CodeResult) roche.CodeResult {
	out := roche.CodeResult{IsMainResult: r.Main}
	for mime, v := range r.Data {
		switch mime {
		case "text/plain":
			out.Text = v
		case "text/html":
			out.HTML = v
		case "text/markdown":
			out.Markdown = v
		case "image/svg+xml":
			out.SVG = v
		case "image/png":
			out.PNG, _ = base64.StdEncoding.DecodeString(v)
		case "image/jpeg":
			out.JPEG, _ = base64.StdEncoding.DecodeString(v)
		case "application/json":
			out.JSON = v
		case "text/latex":
			out.LaTeX = v
		case "application/javascript":
			out.JavaScript = v
		}
	}
	return out
}

var _ kit.CodeWarmer = Forwarder{}

// WarmCode implements kit.CodeWarmer: the agent starts the interpreter with the
// sandbox's workdir and environment, as RunCode would start its default context's.
func (f Forwarder) WarmCode(ctx context.Context, id, language string) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	if err := t.Agent.WarmCode(ctx, language, t.Workdir, nil); err != nil {
		return t.fail(err)
	}
	return nil
}

// CreateContext implements roche.CodeRunner.
func (f Forwarder) CreateContext(ctx context.Context, id string, opts roche.ContextOptions) (roche.CodeContext, error) {
	if err := opts.Validate(); err != nil {
		return roche.CodeContext{}, err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return roche.CodeContext{}, err
	}
	cwd := opts.Cwd
	if cwd == "" {
		cwd = t.Workdir
	}
	cc, err := t.Agent.CreateContext(ctx, opts.Language, cwd, opts.Env)
	if err != nil {
		return roche.CodeContext{}, t.fail(err)
	}
	return CodeContext(cc), nil
}

// CodeContext turns the agent's context description into the core's.
func CodeContext(cc guest.CodeContext) roche.CodeContext {
	return roche.CodeContext{ID: cc.ID, Language: cc.Language, Cwd: cc.Cwd, Default: cc.Default}
}

// Contexts implements roche.CodeRunner.
func (f Forwarder) Contexts(ctx context.Context, id string) ([]roche.CodeContext, error) {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return nil, err
	}
	list, err := t.Agent.Contexts(ctx)
	if err != nil {
		return nil, t.fail(err)
	}
	out := make([]roche.CodeContext, len(list))
	for i, cc := range list {
		out[i] = CodeContext(cc)
	}
	return out, nil
}

// RestartContext implements roche.CodeRunner.
func (f Forwarder) RestartContext(ctx context.Context, id, contextID string) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.RestartContext(ctx, contextID))
}

var _ roche.ContextForker = Forwarder{}

// ForkContext implements roche.ContextForker.
func (f Forwarder) ForkContext(ctx context.Context, id, contextID string) (roche.CodeContext, error) {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return roche.CodeContext{}, err
	}
	cc, err := t.Agent.ForkContext(ctx, contextID)
	if err != nil {
		return roche.CodeContext{}, t.fail(err)
	}
	return CodeContext(cc), nil
}

// RemoveContext implements roche.CodeRunner.
func (f Forwarder) RemoveContext(ctx context.Context, id, contextID string) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.RemoveContext(ctx, contextID))
}
