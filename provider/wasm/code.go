package wasm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/codectx"
	"github.com/roche-sandbox/roche/internal/guest/kernel"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Code contexts in python.wasm: the contexts are internal/guest/codectx's, as in
// roche-agent, with the same kernel (internal/guest/kernel), each in an instance of
// python.wasm that lives as long as the context, in this process. python.wasm has no
// signals, so a cell cannot be interrupted with a KeyboardInterrupt: at its timeout the
// instance is stopped, the cell reports TimedOut, and the next cell starts a fresh
// interpreter (Restarted). It has no matplotlib or pandas either: results are text, and
// what objects' own _repr_*_ methods give.
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

var (
	errKernelStopped = errors.New("code context stopped")
	errNoInterrupt   = errors.New("python.wasm cannot be interrupted (it has no signals)")
)

// codeSet returns sandbox id's code contexts, made on first use.
func (p *Provider) codeSet(id string) (*codectx.Set, error) {
	if _, err := p.lookup(id); err != nil {
		return nil, err
	}
	p.codeMu.Lock()
	defer p.codeMu.Unlock()
	if s := p.codeSets[id]; s != nil {
		return s, nil
	}
	s := codectx.New(codectx.Options{
		Start: func(ctx context.Context, cwd string, env map[string]string) (*codectx.Kernel, error) {
			return p.startKernel(ctx, id, cwd, env)
		},
		// The sandbox's default context ran cells in another process (an earlier roche
		// command), whose interpreter this process cannot reach: this one starts afresh,
		// and its first cell says so.
		Lost: func(lang string) bool {
			return p.elsewhere(id, func(e codeEntry) bool { return e.Default && e.Language == lang })
		},
		Record: func(cc guest.CodeContext, removed bool) { p.recordContext(id, cc, removed) },
		Unknown: func(contextID string) error {
			if p.elsewhere(id, func(e codeEntry) bool { return e.ID == contextID }) {
				return fmt.Errorf("%w: code context %s of wasm sandbox %s lived in another process, which this one cannot reach: "+
					"a wasm context's interpreter lives in the process that started it, and without roched each roche command is a process of its own; "+
					"create the sandbox through roched (roche daemon start) to keep contexts between calls", roche.ErrNotFound, contextID, id)
			}
			return nil
		},
	})
	if p.codeSets == nil {
		p.codeSets = map[string]*codectx.Set{}
	}
	p.codeSets[id] = s
	return s, nil
}

// dropContexts stops and forgets every context of a sandbox, and its spare instance (it
// is being destroyed).
func (p *Provider) dropContexts(id string) {
	p.codeMu.Lock()
	s := p.codeSets[id]
	delete(p.codeSets, id)
	p.codeMu.Unlock()
	if s != nil {
		s.Stop()
	}
}

// codeErr is the core's error for one from sandbox id's contexts: the Set's own are
// the agent protocol's, turned as for the providers forwarding to roche-agent; what
// startKernel returned is the core's already.
func codeErr(id string, err error) error {
	if e, ok := guestfwd.Err(id, err); ok {
		return e
	}
	if errors.Is(err, codectx.ErrStartTimeout) {
		return fmt.Errorf("%w: wasm sandbox %s: %v", roche.ErrTimeout, id, err)
	}
	return err
}

// CreateContext implements roche.CodeRunner.
func (p *Provider) CreateContext(ctx context.Context, id string, opts roche.ContextOptions) (roche.CodeContext, error) {
	if err := opts.Validate(); err != nil {
		return roche.CodeContext{}, err
	}
	s, err := p.codeSet(id)
	if err != nil {
		return roche.CodeContext{}, err
	}
	cc, err := s.Create(ctx, opts.Language, opts.Cwd, opts.Env)
	if err != nil {
		return roche.CodeContext{}, codeErr(id, err)
	}
	return guestfwd.CodeContext(cc), nil
}

// Contexts implements roche.CodeRunner.
func (p *Provider) Contexts(_ context.Context, id string) ([]roche.CodeContext, error) {
	s, err := p.codeSet(id)
	if err != nil {
		return nil, err
	}
	list := s.List()
	out := make([]roche.CodeContext, len(list))
	for i, cc := range list {
		out[i] = guestfwd.CodeContext(cc)
	}
	return out, nil
}

// RestartContext implements roche.CodeRunner.
func (p *Provider) RestartContext(ctx context.Context, id, contextID string) error {
	s, err := p.codeSet(id)
	if err != nil {
		return err
	}
	if err := s.Restart(ctx, contextID); err != nil {
		return codeErr(id, err)
	}
	return nil
}

// RemoveContext implements roche.CodeRunner.
func (p *Provider) RemoveContext(_ context.Context, id, contextID string) error {
	s, err := p.codeSet(id)
	if err != nil {
		return err
	}
	if err := s.Remove(contextID); err != nil {
		return codeErr(id, err)
	}
	return nil
}

// WarmCode implements kit.CodeWarmer: an instance of the kernel, started now with the
// sandbox's own env and workdir as a default context's would be, goes to the sandbox's
// next context started the same way. It counts in the sandbox's memory limit meanwhile.
func (p *Provider) WarmCode(ctx context.Context, id, language string) error {
	s, err := p.codeSet(id)
	if err != nil {
		return err
	}
	if err := s.Warm(ctx, language, "", nil); err != nil {
		return codeErr(id, err)
	}
	if _, err := p.lookup(id); err != nil { // destroyed meanwhile, after its spares were dropped
		p.dropContexts(id)
		return err
	}
	return nil
}

// RunCode implements roche.CodeRunner.
func (p *Provider) RunCode(ctx context.Context, id string, req roche.CodeRequest) (roche.Execution, error) {
	if err := req.Validate(); err != nil {
		return roche.Execution{}, err
	}
	s, err := p.codeSet(id)
	if err != nil {
		return roche.Execution{}, err
	}
	cell := guestfwd.NewCell(req)
	end, err := s.Run(ctx, cell.Request, cellOutput{cell})
	if ctx.Err() != nil {
		return roche.Execution{}, fmt.Errorf("running code in wasm sandbox %s: %w", id, ctx.Err())
	}
	if err != nil {
		return roche.Execution{}, codeErr(id, err)
	}
	return cell.Execution(end), nil
}

// cellOutput passes a cell's output on to what keeps it for its Execution.
type cellOutput struct{ cell *guestfwd.Cell }

func (o cellOutput) Write(s codectx.Stream, p []byte) {
	if s == codectx.Stderr {
		_, _ = o.cell.Stderr.Write(p)
	} else {
		_, _ = o.cell.Stdout.Write(p)
	}
}

func (o cellOutput) Result(ev codectx.Event) {
	o.cell.Result(guest.CodeResult{Data: ev.Data, Main: ev.Main})
}

// wasmKernel is a running instance of the kernel (codectx.Proc).
type wasmKernel struct {
	cancel context.CancelCauseFunc
	ctx    context.Context
	stdin  *io.PipeWriter
	memory *memoryCap
	// callErr is how _start ended, set before the kernel's events end.
	callErr error
}

func (k *wasmKernel) Send(line []byte) error {
	_, err := k.stdin.Write(line)
	return err
}

func (k *wasmKernel) Interrupt() error { return errNoInterrupt }

func (k *wasmKernel) Kill() { k.cancel(errKernelStopped) }

func (k *wasmKernel) Exit() codectx.Exit {
	switch cause := context.Cause(k.ctx); {
	case errors.Is(cause, errClosed):
		return codectx.Exit{How: "was stopped: the wasm provider was closed"}
	case errors.Is(cause, errDestroyed):
		return codectx.Exit{How: "was stopped with its sandbox"}
	}
	how, failed := "exited", false
	var exit *sys.ExitError
	switch {
	case k.callErr == nil:
	case errors.As(k.callErr, &exit):
		how, failed = fmt.Sprintf("exited with status %d", exit.ExitCode()), exit.ExitCode() != 0
	default:
		how, failed = "trapped: "+trimTrace(k.callErr.Error()), true
	}
	// Nothing is killed for asking too much: memory.grow fails and the guest decides. An
	// interpreter that then failed was stopped by the limit, as an exec is (outcome).
	if failed && k.memory.Refused() {
		return codectx.Exit{How: "was refused memory beyond the sandbox's limit and " + how, OOM: true}
	}
	return codectx.Exit{How: how}
}

// startKernel instantiates python.wasm running the kernel in sandbox id, as an exec of
// python3 is run (the sandbox's files, memory limit and start-up hook)
// (codectx.Options.Start). The interpreter starts from a pre-initialised copy
// (preinit.go) made with the kernel's options, when there is one, as an exec's does: a
// new instance each time, so contexts, and a context before and after a restart, share
// nothing but what the copy's start computed (CPython's string-hash secret among it).
func (p *Provider) startKernel(ctx context.Context, id, cwd string, env map[string]string) (*codectx.Kernel, error) {
	rec, err := p.lookup(id)
	if err != nil {
		return nil, err
	}
	mounts, err := p.sandboxMounts(id, rec.Config)
	if err != nil {
		return nil, fmt.Errorf("code context in wasm sandbox %s: %w", id, err)
	}
	prog, err := p.program(ctx, id, rec, mounts, roche.ExecRequest{Cmd: kernel.StdioArgv("python3"), Workdir: cwd, Env: env})
	if err != nil {
		return nil, err
	}
	img := p.kernelPreinit(ctx, prog, mounts)
	// The instance outlives this call: it ends with its context, the sandbox or the provider.
	base, cancel := context.WithCancelCause(p.life)
	wk := &wasmKernel{cancel: cancel, ctx: base, memory: newMemoryCap(rec.Config.MemoryBytes())}
	k := codectx.NewKernel(wk)
	fsc, _, sig := sandboxFS(mounts, prog.python)
	runCtx := withSpaceSignal(experimental.WithMemoryAllocator(base, wk.memory), sig)
	pr, pw := io.Pipe()
	wk.stdin = pw
	var stdin io.Reader = pr
	if img != nil {
		stdin = withPreinitStdin(warmRequest(prog), pr) // warm.py reads the request first
	}
	mcfg := moduleConfig(base, prog.argv, prog.env, fsc, k.StdioWriter(), k.StderrWriter()).WithStdin(stdin)
	p.runMu.Lock()
	if p.closed {
		p.runMu.Unlock()
		cancel(errClosed)
		return nil, fmt.Errorf("%w: the wasm provider is closed", roche.ErrUnavailable)
	}
	p.bg.Add(1)
	p.runMu.Unlock()
	untrack := p.trackExec(id, &execHandle{cancel: cancel})
	mod, err := p.instantiate(runCtx, prog.module, mcfg)
	if err != nil {
		untrack()
		cancel(nil)
		p.bg.Done()
		return nil, fmt.Errorf("code context in wasm sandbox %s: instantiating python.wasm: %w", id, err)
	}
	fail := func(err error) (*codectx.Kernel, error) {
		_ = mod.Close(context.Background())
		untrack()
		cancel(nil)
		p.bg.Done()
		return nil, err
	}
	if wk.memory.OverAtStart() {
		return fail(overAtStart(prog, rec))
	}
	if img != nil {
		if err := p.loadPreinit(mod, img); errors.Is(err, errPreinitMemory) {
			return fail(overAtStart(prog, rec))
		} else if err != nil {
			return fail(fmt.Errorf("code context in wasm sandbox %s: entering the pre-initialised interpreter: %w", id, err))
		}
		p.preinitRuns.Add(1)
		p.log.Debug("wasm: code context's kernel started from the pre-initialised interpreter", "id", id)
	}
	go func() {
		defer p.bg.Done()
		defer untrack()
		// Released when the instance is stopped from outside (its sandbox destroyed, the
		// provider closed): a guest blocked reading its next cell returns, and one
		// writing an event nobody reads drops it.
		stop := context.AfterFunc(base, func() {
			pr.CloseWithError(io.EOF)
			k.Stop("")
		})
		defer stop()
		if img != nil {
			wk.callErr = runPreinit(runCtx, mod, img)
		} else {
			_, wk.callErr = mod.ExportedFunction("_start").Call(runCtx)
		}
		_ = mod.Close(context.Background())
		k.EndEvents()
		cancel(nil)
	}()
	return k, nil
}

// kernelPreinit returns the copy the kernel prog starts from, made with the options
// kernel.StdioArgv gives python3 before -c and with the modules the kernel imports first
// thing already imported (kernelImports), or nil when it starts fresh: for the reasons
// an exec would (warmServes: an environment variable CPython reads at start, text that
// is not UTF-8), or when no copy can be made.
func (p *Provider) kernelPreinit(ctx context.Context, prog program, mounts []mountPoint) *preinitImage {
	at := slices.Index(prog.argv, "-c")
	if !prog.python || at < 1 {
		return nil
	}
	plain := prog
	plain.argv = slices.Delete(slices.Clone(prog.argv), 1, at)
	if !warmServes(plain, mounts) {
		return nil
	}
	return p.preinitFor(ctx, mounts, preinitStart{opts: prog.argv[1:at], preload: kernelImports()})
}

// kernelImports are the modules kernel.Source imports at its top, before anything else
// runs: importing them in the copy changes nothing the kernel sees (it imports them
// anyway, in the same order, and they read nothing of the run while imported), and saves
// each context compiling them (~0.3 s: python.wasm's standard library has no .pyc).
var kernelImports = sync.OnceValue(func() []string {
	var mods []string
	for _, line := range strings.Split(kernel.Source, "\n") {
		name, ok := strings.CutPrefix(line, "import ")
		switch {
		case ok && moduleName.MatchString(name):
			mods = append(mods, name)
		case line == "" || strings.HasPrefix(line, "#"):
		case len(mods) > 0:
			return mods // the end of the first block of imports
		}
	}
	return mods
})

var moduleName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// codeFile, in a sandbox's directory, records the code contexts that processes ran
// cells in, by context id (see above).
const codeFile = "code.json"

type codeEntry struct {
	ID       string `json:"-"`
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
// accepts.
func (p *Provider) elsewhere(sandbox string, match func(codeEntry) bool) bool {
	p.recordMu.Lock()
	defer p.recordMu.Unlock()
	for id, e := range p.readCodeFile(sandbox) {
		e.ID = id
		if e.Process != p.instance && match(e) {
			return true
		}
	}
	return false
}

// recordContext notes that this process runs cc in sandbox (removed: no longer),
// replacing what another process recorded of the same default context. Best effort: the
// record only words what a later process says.
func (p *Provider) recordContext(sandbox string, cc guest.CodeContext, removed bool) {
	p.recordMu.Lock()
	defer p.recordMu.Unlock()
	dir := p.sandboxDir(sandbox)
	m := p.readCodeFile(sandbox)
	if m == nil {
		m = map[string]codeEntry{}
	}
	for id, e := range m {
		if cc.Default && e.Default && e.Language == cc.Language {
			delete(m, id)
		}
	}
	delete(m, cc.ID)
	if !removed {
		m[cc.ID] = codeEntry{Process: p.instance, Language: cc.Language, Default: cc.Default}
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
