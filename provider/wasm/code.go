package wasm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/tetratelabs/wazero/experimental"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/kernel"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Code contexts in python.wasm: the same kernel roche-agent runs (internal/guest/kernel), in an
// instance of python.wasm that lives as long as the context, in this process. python.wasm
// has no signals, so a cell cannot be interrupted with a KeyboardInterrupt: at its
// timeout the instance is closed, the cell reports TimedOut, and the next cell starts a
// fresh interpreter (Restarted). It has no matplotlib or pandas either: results are
// text, and what objects' own _repr_*_ methods give.
//
// A context's interpreter lives in the memory of the process that started it: roched
// keeps it between calls, but the direct-mode CLI is a process per command, which cannot
// reach an earlier command's. So that such a call is not silently a fresh interpreter,
// each process records in the sandbox's directory (codeFile) the contexts it ran cells
// in; a later process that finds another's default context there starts its own saying
// Restarted, and a named context of another process is "not found" saying why.

var (
	_ roche.CodeRunner = (*Provider)(nil)
	_ kit.CodeWarmer   = (*Provider)(nil)
)

// kernelReady bounds a kernel's start: instantiating python.wasm and its imports.
const kernelReady = time.Minute

var errCellTimeout = errors.New("cell timeout")

// codeContext is one context of a sandbox.
type codeContext struct {
	roche.CodeContext
	sandbox string
	env     map[string]string // added to the sandbox's environment for the interpreter

	run   sync.Mutex // held while a cell runs
	mu    sync.Mutex // guards what follows
	k     *wasmKernel
	lost  bool // the interpreter died, or lived in another process: the next cell says Restarted
	gone  bool // removed
	cells int
}

// wasmKernel is a running instance of the kernel.
type wasmKernel struct {
	cancel context.CancelCauseFunc
	ctx    context.Context
	stdin  *io.PipeWriter
	events chan kernel.Event // closed when the instance ends
	memory *memoryCap
	// callErr is how _start ended, set before events closes.
	callErr error

	mu   sync.Mutex
	cell *wasmCell // where raw stderr and stray stdout go
	line []byte    // a partial event line
	// overlong: the line being written passed maxEventLine, and goes on as stdout.
	overlong bool
}

// wasmCell is the running cell's output.
type wasmCell struct {
	stdout, stderr *capped
}

type capped struct {
	w         io.Writer
	into      *[]string
	limit     int64
	written   int64
	truncated bool
}

func (c *capped) write(s string) {
	if room := c.limit - c.written; int64(len(s)) > room {
		s = s[:max(room, 0)]
		c.truncated = true
	}
	if s == "" {
		return
	}
	c.written += int64(len(s))
	*c.into = append(*c.into, s)
	if c.w != nil {
		_, _ = io.WriteString(c.w, s)
	}
}

// eventWriter is the instance's stdout: event lines, each parsed and queued; a line
// that is not an event (a raw write to fd 1) is the cell's stdout.
type eventWriter struct{ k *wasmKernel }

// maxEventLine bounds an event line, as roche-agent bounds the kernel's (a result with a
// large image): a longer line is no event and is the cell's stdout, passed on as it
// comes rather than held whole (a cell writing to fd 1 without a newline would make
// roched hold all of it).
var maxEventLine = 7 << 20

func (w eventWriter) Write(p []byte) (int, error) {
	k := w.k
	// What is held has no newline: only the new bytes are searched.
	from := len(k.line)
	k.line = append(k.line, p...)
	for {
		i := bytes.IndexByte(k.line[from:], '\n')
		if i < 0 {
			if k.overlong || len(k.line) > maxEventLine {
				k.raw(string(k.line), false)
				k.line, k.overlong = k.line[:0], true
			}
			return len(p), nil
		}
		line := k.line[:from+i+1]
		var ev kernel.Event
		if !k.overlong && len(line) <= maxEventLine && json.Unmarshal(line, &ev) == nil && ev.T != "" {
			select {
			case k.events <- ev:
			case <-k.ctx.Done():
			}
		} else {
			k.raw(string(line), false)
		}
		k.line, k.overlong, from = k.line[from+i+1:], false, 0
	}
}

// stderrWriter is the instance's raw stderr.
type stderrWriter struct{ k *wasmKernel }

func (w stderrWriter) Write(p []byte) (int, error) {
	w.k.raw(string(p), true)
	return len(p), nil
}

func (k *wasmKernel) raw(s string, stderr bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cell == nil {
		return
	}
	if stderr {
		k.cell.stderr.write(s)
	} else {
		k.cell.stdout.write(s)
	}
}

func (k *wasmKernel) setCell(c *wasmCell) {
	k.mu.Lock()
	k.cell = c
	k.mu.Unlock()
}

func checkLanguage(lang string) (string, error) {
	switch lang {
	case "", roche.LanguagePython:
		return roche.LanguagePython, nil
	}
	return "", fmt.Errorf("%w: %s contexts are not served by the wasm provider: python.wasm runs only python", roche.ErrUnsupported, lang)
}

// CreateContext implements roche.CodeRunner.
func (p *Provider) CreateContext(ctx context.Context, id string, opts roche.ContextOptions) (roche.CodeContext, error) {
	if err := opts.Validate(); err != nil {
		return roche.CodeContext{}, err
	}
	lang, err := checkLanguage(opts.Language)
	if err != nil {
		return roche.CodeContext{}, err
	}
	if _, err := p.lookup(id); err != nil {
		return roche.CodeContext{}, err
	}
	cx := p.addContext(id, lang, opts.Cwd, opts.Env, false)
	cx.run.Lock()
	defer cx.run.Unlock()
	if _, err := p.ensureKernel(ctx, cx); err != nil {
		p.dropContext(cx, false)
		return roche.CodeContext{}, err
	}
	p.codeMu.Lock()
	p.recordContext(cx, false)
	p.codeMu.Unlock()
	return cx.CodeContext, nil
}

func (p *Provider) addContext(sandbox, lang, cwd string, env map[string]string, isDefault bool) *codeContext {
	var b [6]byte
	_, _ = rand.Read(b[:])
	cx := &codeContext{CodeContext: roche.CodeContext{ID: hex.EncodeToString(b[:]), Language: lang, Cwd: cwd, Default: isDefault}, sandbox: sandbox, env: env}
	p.codeMu.Lock()
	defer p.codeMu.Unlock()
	if p.contexts == nil {
		p.contexts = map[string]*codeContext{}
	}
	p.contexts[cx.ID] = cx
	return cx
}

// defaultContext returns the sandbox's default context for lang, made on first use.
func (p *Provider) defaultContext(sandbox, lang, cwd string, env map[string]string) *codeContext {
	p.codeMu.Lock()
	for _, cx := range p.contexts {
		if cx.sandbox == sandbox && cx.Default && cx.Language == lang {
			p.codeMu.Unlock()
			return cx
		}
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	cx := &codeContext{CodeContext: roche.CodeContext{ID: hex.EncodeToString(b[:]), Language: lang, Cwd: cwd, Default: true}, sandbox: sandbox, env: env}
	// The sandbox's default context ran cells in another process (an earlier roche
	// command), whose interpreter this process cannot reach: this one starts afresh, and
	// its first cell says so.
	cx.lost = p.elsewhere(sandbox, func(e codeEntry) bool { return e.Default && e.Language == lang })
	if p.contexts == nil {
		p.contexts = map[string]*codeContext{}
	}
	p.contexts[cx.ID] = cx
	p.codeMu.Unlock()
	return cx
}

// codeFile, in a sandbox's directory, records the code contexts that processes ran
// cells in, by context id (see above).
const codeFile = "code.json"

type codeEntry struct {
	Process  string `json:"process"` // the Provider instance that runs it
	Language string `json:"language"`
	Default  bool   `json:"default,omitempty"`
}

func (p *Provider) readCodeFile(sandbox string) map[string]codeEntry {
	var m map[string]codeEntry
	if b, err := os.ReadFile(filepath.Join(p.sandboxDir(sandbox), codeFile)); err == nil {
		_ = json.Unmarshal(b, &m)
	}
	return m
}

// elsewhere reports whether another process recorded a context of sandbox that match
// accepts. codeMu is held.
func (p *Provider) elsewhere(sandbox string, match func(codeEntry) bool) bool {
	for _, e := range p.readCodeFile(sandbox) {
		if e.Process != p.instance && match(e) {
			return true
		}
	}
	return false
}

// recordContext notes that this process runs cx (remove: no longer), replacing what
// another process recorded of the same default context. Best effort: the record only
// words what a later process says. codeMu is held.
func (p *Provider) recordContext(cx *codeContext, remove bool) {
	dir := p.sandboxDir(cx.sandbox)
	m := p.readCodeFile(cx.sandbox)
	if m == nil {
		m = map[string]codeEntry{}
	}
	for id, e := range m {
		if cx.Default && e.Default && e.Language == cx.Language {
			delete(m, id)
		}
	}
	delete(m, cx.ID)
	if !remove {
		m[cx.ID] = codeEntry{Process: p.instance, Language: cx.Language, Default: cx.Default}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return
	}
	tmp := filepath.Join(dir, codeFile+"."+p.instance+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return
	}
	if err := os.Rename(tmp, filepath.Join(dir, codeFile)); err != nil {
		_ = os.Remove(tmp)
	}
}

func (p *Provider) context(sandbox, contextID string) (*codeContext, error) {
	p.codeMu.Lock()
	defer p.codeMu.Unlock()
	cx, ok := p.contexts[contextID]
	if !ok || cx.sandbox != sandbox {
		if e, ok := p.readCodeFile(sandbox)[contextID]; ok && e.Process != p.instance {
			return nil, fmt.Errorf("%w: code context %s of wasm sandbox %s lived in another process, which this one cannot reach: "+
				"a wasm context's interpreter lives in the process that started it, and without roched each roche command is a process of its own; "+
				"create the sandbox through roched (roche daemon start) to keep contexts between calls", roche.ErrNotFound, contextID, sandbox)
		}
		return nil, fmt.Errorf("%w: no code context %q in wasm sandbox %s", roche.ErrNotFound, contextID, sandbox)
	}
	return cx, nil
}

// dropContext stops and forgets a context; unrecord also takes it out of the sandbox's
// record (not while the sandbox is being destroyed: a file written into its directory
// then could keep the directory from going).
func (p *Provider) dropContext(cx *codeContext, unrecord bool) {
	p.codeMu.Lock()
	if _, ok := p.contexts[cx.ID]; ok && unrecord {
		p.recordContext(cx, true)
	}
	delete(p.contexts, cx.ID)
	p.codeMu.Unlock()
	cx.mu.Lock()
	cx.gone = true
	k := cx.k
	cx.mu.Unlock()
	if k != nil {
		k.cancel(errDestroyed)
	}
}

// dropContexts stops and forgets every context of a sandbox, and its spare instance (it
// is being destroyed).
func (p *Provider) dropContexts(sandbox string) {
	p.codeMu.Lock()
	var list []*codeContext
	for _, cx := range p.contexts {
		if cx.sandbox == sandbox {
			list = append(list, cx)
		}
	}
	spare := p.spares[sandbox]
	delete(p.spares, sandbox)
	p.codeMu.Unlock()
	for _, cx := range list {
		p.dropContext(cx, false)
	}
	if spare != nil {
		spare.k.cancel(errDestroyed)
	}
}

// WarmCode implements kit.CodeWarmer: an instance of the kernel, started now with the
// sandbox's own env and workdir as a default context's would be, goes to the sandbox's
// next context started the same way. It counts in the sandbox's memory limit meanwhile.
func (p *Provider) WarmCode(ctx context.Context, id, language string) error {
	lang, err := checkLanguage(language)
	if err != nil {
		return err
	}
	if _, err := p.lookup(id); err != nil {
		return err
	}
	spare := &codeContext{CodeContext: roche.CodeContext{Language: lang}, sandbox: id}
	if spare.k, err = p.startKernel(ctx, spare); err != nil {
		return err
	}
	p.codeMu.Lock()
	if p.spares == nil {
		p.spares = map[string]*codeContext{}
	}
	old := p.spares[id]
	p.spares[id] = spare
	p.codeMu.Unlock()
	if old != nil {
		old.k.cancel(errDestroyed)
	}
	if _, err := p.lookup(id); err != nil { // destroyed meanwhile, after its spares were dropped
		p.dropContexts(id)
		return err
	}
	return nil
}

// takeSpare hands over the sandbox's spare instance if it runs cx's language and was
// started with cx's workdir and env; else nil, and the spare stays.
func (p *Provider) takeSpare(cx *codeContext) *wasmKernel {
	p.codeMu.Lock()
	defer p.codeMu.Unlock()
	sp := p.spares[cx.sandbox]
	if sp == nil || sp.Language != cx.Language || sp.Cwd != cx.Cwd || !maps.Equal(sp.env, cx.env) {
		return nil
	}
	delete(p.spares, cx.sandbox)
	if sp.k.ctx.Err() != nil { // it ended while waiting
		return nil
	}
	return sp.k
}

// Contexts implements roche.CodeRunner.
func (p *Provider) Contexts(_ context.Context, id string) ([]roche.CodeContext, error) {
	if _, err := p.lookup(id); err != nil {
		return nil, err
	}
	p.codeMu.Lock()
	defer p.codeMu.Unlock()
	out := []roche.CodeContext{}
	for _, cx := range p.contexts {
		if cx.sandbox == id {
			out = append(out, cx.CodeContext)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RestartContext implements roche.CodeRunner.
func (p *Provider) RestartContext(ctx context.Context, id, contextID string) error {
	cx, err := p.context(id, contextID)
	if err != nil {
		return err
	}
	cx.mu.Lock()
	k := cx.k
	cx.mu.Unlock()
	if k != nil {
		k.cancel(errDestroyed)
	}
	cx.run.Lock()
	defer cx.run.Unlock()
	cx.mu.Lock()
	cx.k, cx.lost = nil, false
	cx.mu.Unlock()
	_, err = p.ensureKernel(ctx, cx)
	return err
}

// RemoveContext implements roche.CodeRunner.
func (p *Provider) RemoveContext(_ context.Context, id, contextID string) error {
	cx, err := p.context(id, contextID)
	if err != nil {
		return err
	}
	p.dropContext(cx, true)
	return nil
}

// ensureKernel starts the context's interpreter unless it has one. cx.run is held.
func (p *Provider) ensureKernel(ctx context.Context, cx *codeContext) (*wasmKernel, error) {
	cx.mu.Lock()
	k, gone := cx.k, cx.gone
	cx.mu.Unlock()
	if gone {
		return nil, fmt.Errorf("%w: code context %s was removed", roche.ErrNotFound, cx.ID)
	}
	if k != nil {
		return k, nil
	}
	k = p.takeSpare(cx)
	if k == nil {
		var err error
		if k, err = p.startKernel(ctx, cx); err != nil {
			return nil, err
		}
	}
	cx.mu.Lock()
	defer cx.mu.Unlock()
	if cx.gone {
		k.cancel(errDestroyed)
		return nil, fmt.Errorf("%w: code context %s was removed", roche.ErrNotFound, cx.ID)
	}
	cx.k = k
	return k, nil
}

// startKernel instantiates python.wasm running the kernel, as an exec of python3 is run
// (the sandbox's files, memory limit and start-up hook), and waits for it to be ready.
func (p *Provider) startKernel(ctx context.Context, cx *codeContext) (*wasmKernel, error) {
	rec, err := p.lookup(cx.sandbox)
	if err != nil {
		return nil, err
	}
	mounts, err := p.sandboxMounts(cx.sandbox, rec.Config)
	if err != nil {
		return nil, fmt.Errorf("code context in wasm sandbox %s: %w", cx.sandbox, err)
	}
	prog, err := p.program(ctx, cx.sandbox, rec, mounts, roche.ExecRequest{Cmd: kernel.StdioArgv("python3"), Workdir: cx.Cwd, Env: cx.env})
	if err != nil {
		return nil, err
	}
	// The instance outlives this call: it ends with its context, the sandbox or the provider.
	base, cancel := context.WithCancelCause(p.life)
	k := &wasmKernel{cancel: cancel, ctx: base, events: make(chan kernel.Event, 64), memory: newMemoryCap(rec.Config.MemoryBytes())}
	fsc, _, sig := sandboxFS(mounts, prog.python)
	runCtx := withSpaceSignal(experimental.WithMemoryAllocator(base, k.memory), sig)
	pr, pw := io.Pipe()
	k.stdin = pw
	mcfg := moduleConfig(base, prog.argv, prog.env, fsc, eventWriter{k}, stderrWriter{k}).WithStdin(pr)
	p.runMu.Lock()
	if p.closed {
		p.runMu.Unlock()
		cancel(errClosed)
		return nil, fmt.Errorf("%w: the wasm provider is closed", roche.ErrUnavailable)
	}
	p.bg.Add(1)
	p.runMu.Unlock()
	untrack := p.trackExec(cx.sandbox, &execHandle{cancel: cancel})
	mod, err := p.runtime.InstantiateModule(runCtx, prog.module, mcfg)
	if err != nil {
		untrack()
		cancel(nil)
		p.bg.Done()
		return nil, fmt.Errorf("code context in wasm sandbox %s: instantiating python.wasm: %w", cx.sandbox, err)
	}
	if k.memory.OverAtStart() {
		_ = mod.Close(context.Background())
		untrack()
		cancel(nil)
		p.bg.Done()
		return nil, overAtStart(prog, rec)
	}
	go func() {
		defer p.bg.Done()
		defer untrack()
		// Released when the context ends, so that a guest blocked reading its next cell
		// returns.
		stop := context.AfterFunc(base, func() { pr.CloseWithError(io.EOF) })
		defer stop()
		_, k.callErr = mod.ExportedFunction("_start").Call(runCtx)
		_ = mod.Close(context.Background())
		close(k.events)
		cancel(nil)
	}()

	var early []string
	k.setCell(&wasmCell{stdout: &capped{into: &early, limit: 4096}, stderr: &capped{into: &early, limit: 4096}})
	defer k.setCell(nil)
	timer := time.NewTimer(kernelReady)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-k.events:
			if !ok {
				k.mu.Lock()
				msg := fmt.Sprint(early)
				k.mu.Unlock()
				return nil, fmt.Errorf("the python kernel in wasm sandbox %s ended at start (%v): %s", cx.sandbox, k.callErr, msg)
			}
			if ev.T == kernel.EventReady {
				return k, nil
			}
		case <-timer.C:
			cancel(errCellTimeout)
			return nil, fmt.Errorf("%w: the python kernel in wasm sandbox %s did not start within %s", roche.ErrTimeout, cx.sandbox, kernelReady)
		case <-ctx.Done():
			cancel(ctx.Err())
			return nil, ctx.Err()
		}
	}
}

// RunCode implements roche.CodeRunner.
func (p *Provider) RunCode(ctx context.Context, id string, req roche.CodeRequest) (roche.Execution, error) {
	if err := req.Validate(); err != nil {
		return roche.Execution{}, err
	}
	if _, err := p.lookup(id); err != nil {
		return roche.Execution{}, err
	}
	start := time.Now()
	var cx *codeContext
	if req.Context != "" {
		var err error
		if cx, err = p.context(id, req.Context); err != nil {
			return roche.Execution{}, err
		}
		if req.Language != "" && req.Language != cx.Language {
			return roche.Execution{}, fmt.Errorf("%w: code context %s runs %s, not %s", roche.ErrInvalidConfig, cx.ID, cx.Language, req.Language)
		}
	} else {
		lang, err := checkLanguage(req.Language)
		if err != nil {
			return roche.Execution{}, err
		}
		cx = p.defaultContext(id, lang, req.Cwd, req.Env)
	}
	cx.run.Lock()
	defer cx.run.Unlock()
	ex := roche.Execution{Context: cx.ID, Logs: roche.CodeLogs{Stdout: []string{}, Stderr: []string{}}}
	cx.mu.Lock()
	ex.Restarted = cx.lost
	cx.mu.Unlock()
	k, err := p.ensureKernel(ctx, cx)
	if err != nil {
		return roche.Execution{}, err
	}
	cx.mu.Lock()
	cx.lost = false
	cx.cells++
	cell := cx.cells
	cx.mu.Unlock()
	if cell == 1 {
		p.codeMu.Lock()
		p.recordContext(cx, false)
		p.codeMu.Unlock()
	}

	limit := req.OutputLimit
	if limit <= 0 {
		limit = roche.DefaultOutputLimit
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = roche.DefaultCodeTimeout
	}
	out := &wasmCell{
		stdout: &capped{w: req.Stdout, into: &ex.Logs.Stdout, limit: limit},
		stderr: &capped{w: req.Stderr, into: &ex.Logs.Stderr, limit: limit},
	}
	k.setCell(out)
	defer k.setCell(nil)
	go func() { _, _ = k.stdin.Write(kernel.Cell{ID: cell, Code: req.Code}.Line()) }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	done := false
loop:
	for {
		select {
		case ev, ok := <-k.events:
			if !ok {
				break loop
			}
			k.mu.Lock()
			switch ev.T {
			case kernel.EventStdout:
				out.stdout.write(ev.S)
			case kernel.EventStderr:
				out.stderr.write(ev.S)
			case kernel.EventResult:
				r := codeResult(ev)
				ex.Results = append(ex.Results, r)
				if req.OnResult != nil {
					req.OnResult(r)
				}
			case kernel.EventError:
				ex.Error = &roche.CodeError{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
			case kernel.EventDone:
				if ev.ID == cell {
					ex.ExecutionCount = ev.Count
					done = true
				}
			}
			k.mu.Unlock()
			if done {
				break loop
			}
		case <-timer.C:
			k.cancel(errCellTimeout)
		case <-ctx.Done():
			k.cancel(ctx.Err())
		}
	}
	if !done {
		// The instance ended: wait for _start to return, then say why.
		for range k.events {
		}
		cx.mu.Lock()
		if cx.k == k {
			cx.k, cx.lost = nil, true
		}
		cx.mu.Unlock()
		cause := context.Cause(k.ctx)
		switch {
		case ctx.Err() != nil:
			return roche.Execution{}, fmt.Errorf("running code in wasm sandbox %s: %w", id, ctx.Err())
		case errors.Is(cause, errDestroyed):
			return roche.Execution{}, fmt.Errorf("%w: the code context or wasm sandbox %s was removed while the cell ran", roche.ErrNotFound, id)
		case errors.Is(cause, errClosed):
			return roche.Execution{}, fmt.Errorf("%w: the wasm provider was closed while the cell ran", roche.ErrUnavailable)
		case errors.Is(cause, errCellTimeout):
			ex.TimedOut = true
			ex.Error = &roche.CodeError{Name: "TimeoutError", Value: fmt.Sprintf(
				"the cell was stopped at its timeout of %s; python.wasm cannot be interrupted, so its interpreter was closed and the next call starts a fresh context", timeout)}
		default:
			ex.Error = &roche.CodeError{Name: "ContextDied", Value: fmt.Sprintf("the interpreter ended (%s); the next call starts a fresh context", describeEnd(k))}
		}
	}
	ex.Truncated = out.stdout.truncated || out.stderr.truncated
	ex.Duration = time.Since(start)
	return ex, nil
}

func describeEnd(k *wasmKernel) string {
	if k.callErr == nil {
		return "it exited"
	}
	msg := trimTrace(k.callErr.Error())
	if k.memory.Refused() {
		msg += "; it had been refused memory beyond the sandbox's limit"
	}
	return msg
}

// codeResult turns the kernel's MIME bundle into the core's result, as for roche-agent.
func codeResult(ev kernel.Event) roche.CodeResult {
	return guestfwd.CodeResult(guest.CodeResult{Data: ev.Data, Main: ev.Main})
}
