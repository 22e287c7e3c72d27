package wasm

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

const (
	// ExitCodeKilled is the exit code of a command stopped at its timeout: 128+SIGKILL,
	// what the Docker provider reports for a command it kills.
	ExitCodeKilled = 137
	// ExitCodeTrap is the exit code of a module that trapped (an unreachable
	// instruction, which is also how WASI libc's abort() ends, an out-of-bounds access,
	// a division by zero): 128+SIGABRT, as wasmtime reports it on Unix.
	ExitCodeTrap = 134

	// maxModuleSize bounds a .wasm file read from the sandbox; python.wasm is 26 MB.
	maxModuleSize = 256 << 20
	// trapTraceLines bounds the wasm stack trace appended to stderr after a trap.
	trapTraceLines = 16

	wasiModule = "wasi_snapshot_preview1"
)

//go:embed boot/sitecustomize.py boot/warm.py
var bootFiles embed.FS

var (
	errExecTimeout = errors.New("exec timeout")
	errDestroyed   = errors.New("sandbox destroyed")
	errClosed      = errors.New("provider closed")
)

// execHandle lets Destroy stop an exec running in this process.
type execHandle struct{ cancel context.CancelCauseFunc }

func (p *Provider) trackExec(id string, h *execHandle) func() {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	if p.running[id] == nil {
		p.running[id] = map[*execHandle]struct{}{}
	}
	p.running[id][h] = struct{}{}
	return func() {
		p.runMu.Lock()
		defer p.runMu.Unlock()
		delete(p.running[id], h)
		if len(p.running[id]) == 0 {
			delete(p.running, id)
		}
	}
}

func (p *Provider) stopExecs(id string) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	for h := range p.running[id] {
		h.cancel(errDestroyed)
	}
}

// program is what an exec runs: a compiled module and how to start it.
type program struct {
	module     wazero.CompiledModule
	closeAfter bool // compiled for this exec only
	argv       []string
	env        map[string]string
	python     bool // gets the start-up hook mounted at /.roche

	// For Python, what the start-up hook turns env into (the exec's own environment)
	// and the working directory it moves to.
	userEnv map[string]string
	workdir string
}

// Exec implements roche.Provider. Each exec instantiates its module afresh, so nothing
// of one exec's memory survives into the next; files in /tmp, /workspace and rw mounts do.
func (p *Provider) Exec(ctx context.Context, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	if err := req.Validate(); err != nil {
		return roche.ExecResult{}, err
	}
	if req.IdempotencyKey != "" {
		return roche.ExecResult{}, fmt.Errorf("%w: the wasm provider has no durable commands, so no idempotency keys: each exec is one module run in this process", roche.ErrUnsupported)
	}
	rec, err := p.lookup(id)
	if err != nil {
		return roche.ExecResult{}, err
	}
	mounts, err := p.sandboxMounts(id, rec.Config)
	if err != nil {
		return roche.ExecResult{}, fmt.Errorf("exec in wasm sandbox %s: %w", id, err)
	}
	prog, err := p.program(ctx, id, rec, mounts, req)
	if err != nil {
		return roche.ExecResult{}, err
	}
	if prog.closeAfter {
		defer prog.module.Close(context.Background())
	}

	timeout := req.Timeout
	if timeout <= 0 {
		timeout = max(time.Until(rec.ExpiresAt), time.Second)
	}
	stdout, stderr := kit.Captures(req)
	var res roche.ExecResult
	served := false
	if p.warmStart {
		// The interpreter this exec may take is replaced once it is over.
		defer p.startWarm(rec, warmDelay)
		if warmServes(prog, mounts) {
			if w := p.takeWarm(id); w != nil {
				res, served, err = p.execWarm(ctx, w, rec, mounts, prog, req, stdout, stderr, timeout)
			}
		}
	}
	if !served {
		res, err = p.run(ctx, id, rec, mounts, prog, req.Stdin, stdout, stderr, timeout)
	}
	if err != nil {
		return roche.ExecResult{}, err
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	res.Truncated = stdout.Truncated() || stderr.Truncated()
	return res, nil
}

// program maps the command onto a module: python3 (or python) onto python.wasm, a path
// ending in .wasm onto that module in the sandbox. There is nothing else to run: no
// shell, no coreutils.
func (p *Provider) program(ctx context.Context, id string, rec record, mounts []mountPoint, req roche.ExecRequest) (program, error) {
	env := map[string]string{}
	for k, v := range rec.Config.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	workdir := req.Workdir
	if workdir == "" {
		workdir = rec.Config.Workdir
	}
	if err := checkWorkdir(workdir); err != nil {
		return program{}, err
	}
	cmd := req.Cmd[0]

	switch {
	case isPython(cmd):
		if workdir == "" {
			workdir = DefaultWorkdir
		}
		workdir = path.Clean(workdir)
		m, rel := resolve(mounts, workdir)
		if fi, err := statIn(m.host, rel); err != nil || !fi.IsDir() {
			return program{}, fmt.Errorf("%w: workdir %s does not exist in wasm sandbox %s: create it first (under /tmp or /workspace) or choose another",
				roche.ErrInvalidConfig, workdir, id)
		}
		mod, err := p.pythonModule(ctx)
		if err != nil {
			return program{}, err
		}
		// Reserved for making a pre-initialised interpreter (boot/sitecustomize.py).
		delete(env, preinitEnv)
		userEnv := maps.Clone(env)
		// The start-up hook (boot/sitecustomize.py) reads these and removes them.
		env["ROCHE_WASM_WORKDIR"] = workdir
		if pp, ok := env["PYTHONPATH"]; ok {
			env["ROCHE_WASM_PYTHONPATH"] = pp
			env["PYTHONPATH"] = guestBoot + ":" + pp
		} else {
			delete(env, "ROCHE_WASM_PYTHONPATH")
			env["PYTHONPATH"] = guestBoot
		}
		return program{module: mod, argv: pythonArgv(req.Cmd, workdir), env: env, python: true,
			userEnv: userEnv, workdir: workdir}, nil

	case strings.HasSuffix(cmd, ".wasm"):
		// WASI libc starts every module in / and has no way to be told otherwise; only
		// Python gets a start-up hook that moves it.
		if workdir != "" && path.Clean(workdir) != "/" {
			return program{}, fmt.Errorf("%w: a .wasm module always starts in / (WASI passes no working directory), so workdir %s cannot be honoured: run it without a workdir and give it absolute paths",
				roche.ErrUnsupported, workdir)
		}
		mod, err := p.compileGuestModule(ctx, id, mounts, guestPath(cmd, "/"))
		if err != nil {
			return program{}, err
		}
		return program{module: mod, closeAfter: true, argv: req.Cmd, env: env}, nil
	}
	return program{}, fmt.Errorf("%w: wasm sandboxes run python3 or a .wasm module; `%s` is not available (there is no shell or other program: do it in Python, or use the docker provider)",
		roche.ErrUnsupported, cmd)
}

// checkWorkdir refuses working directories the guest could not enter: /usr is python.wasm's
// packed standard library, whatever the sandbox's directories hold there.
func checkWorkdir(workdir string) error {
	if workdir == "" {
		return nil
	}
	if w := path.Clean(workdir); within(w, guestStdlib) || within(w, guestBoot) {
		return fmt.Errorf("%w: workdir %s is inside python.wasm's read-only standard library: use /workspace, /tmp or a mount", roche.ErrUnsupported, w)
	}
	return nil
}

// isPython reports whether cmd names the Python interpreter, bare or by a path such as
// /usr/bin/python3 or /usr/local/bin/python3.12.
func isPython(cmd string) bool {
	switch path.Base(cmd) {
	case "python", "python3", "python3.12":
		return true
	}
	return false
}

// pythonArgv makes a relative script path in argv absolute against workdir. CPython
// makes the script path absolute while it starts, before the start-up hook has moved it
// out of /, so "python3 script.py" would look for /script.py. sys.argv[0] then shows
// the absolute path.
func pythonArgv(argv []string, workdir string) []string {
	out := slices.Clone(argv)
	for i := 1; i < len(out); i++ {
		a := out[i]
		switch {
		case a == "--":
			if i+1 < len(out) {
				out[i+1] = scriptPath(out[i+1], workdir)
			}
			return out
		case a == "-" || !strings.HasPrefix(a, "-"):
			out[i] = scriptPath(a, workdir)
			return out
		case strings.HasPrefix(a, "--"):
			if a == "--check-hash-based-pycs" {
				i++ // its value follows
			}
			continue
		}
		// A cluster of one-letter options such as -uB, which may end in one taking a value.
		for j := 1; j < len(a); j++ {
			switch a[j] {
			case 'c', 'm':
				return out // the program is the next argument, not a file
			case 'W', 'X':
				if j == len(a)-1 {
					i++ // its value is the next argument
				}
				j = len(a)
			}
		}
	}
	return out
}

func scriptPath(p, workdir string) string {
	if p == "-" || path.IsAbs(p) {
		return p
	}
	return path.Join(workdir, p)
}

// compileGuestModule reads and compiles the .wasm module at the guest path p.
func (p *Provider) compileGuestModule(ctx context.Context, id string, mounts []mountPoint, guest string) (wazero.CompiledModule, error) {
	m, rel := resolve(mounts, guest)
	bin, err := readModule(m.host, rel)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: no module %s in wasm sandbox %s: copy it in first (roche cp FILE %s:%s)",
				roche.ErrInvalidConfig, guest, id, id, guest)
		}
		return nil, fmt.Errorf("%w: reading module %s in wasm sandbox %s: %v", roche.ErrInvalidConfig, guest, id, err)
	}
	if len(bin) < 8 || string(bin[:4]) != "\x00asm" {
		return nil, fmt.Errorf("%w: %s is not a WebAssembly module: it does not start with the \\0asm magic number",
			roche.ErrInvalidConfig, guest)
	}
	mod, err := p.runtime.CompileModule(context.Background(), bin) // see pythonModule
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not a valid WebAssembly module: %v", roche.ErrInvalidConfig, guest, err)
	}
	if err := checkCommandModule(mod); err != nil {
		_ = mod.Close(ctx)
		return nil, fmt.Errorf("%s cannot run in a wasm sandbox: %w", guest, err)
	}
	return mod, nil
}

// readModule reads rel in the host directory dir, confined to it, up to maxModuleSize.
func readModule(dir, rel string) ([]byte, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	} else if fi.Size() > maxModuleSize {
		return nil, fmt.Errorf("%d bytes is over the %d MiB limit for a module", fi.Size(), maxModuleSize>>20)
	}
	return io.ReadAll(io.LimitReader(f, maxModuleSize+1))
}

// instantiate instantiates mod, and when mod is python.wasm's, writes python.wasm's data
// into the new instance's memory (pythonData), as the instantiation of a module that
// kept it would have, before any of its code runs.
func (p *Provider) instantiate(ctx context.Context, mod wazero.CompiledModule, mcfg wazero.ModuleConfig) (api.Module, error) {
	inst, err := p.runtime.InstantiateModule(ctx, mod, mcfg)
	if err != nil {
		return nil, err
	}
	var segs []memorySegment
	if d := p.pythonData.Load(); d != nil && d.module == mod {
		segs = d.segs
	}
	if err := p.fromMappings(func() error { return writeData(inst, segs) }); err != nil {
		_ = inst.Close(context.Background())
		return nil, err
	}
	return inst, nil
}

// checkCommandModule accepts WASI command modules that need nothing but WASI: the only
// host functions a sandbox offers are wasi_snapshot_preview1's.
func checkCommandModule(mod wazero.CompiledModule) error {
	var foreign []string
	for _, f := range mod.ImportedFunctions() {
		if m, name, _ := f.Import(); m != wasiModule {
			foreign = append(foreign, m+"."+name)
		}
	}
	if len(foreign) > 0 {
		if len(foreign) > 5 {
			foreign = append(foreign[:5], "...")
		}
		return fmt.Errorf("%w: the module imports %s; wasm sandboxes provide only %s",
			roche.ErrUnsupported, strings.Join(foreign, ", "), wasiModule)
	}
	if len(mod.ImportedMemories()) > 0 {
		return fmt.Errorf("%w: the module imports its memory; wasm sandboxes provide only %s functions",
			roche.ErrUnsupported, wasiModule)
	}
	if _, ok := mod.ExportedFunctions()["_start"]; !ok {
		return fmt.Errorf("%w: the module exports no _start function, so it is not a WASI command (a reactor or library module cannot be run)",
			roche.ErrUnsupported)
	}
	return nil
}

// run instantiates prog and calls its _start, reporting what happened as the result.
func (p *Provider) run(ctx context.Context, id string, rec record, mounts []mountPoint, prog program,
	stdin io.Reader, stdout, stderr io.Writer, timeout time.Duration) (roche.ExecResult, error) {
	// The guest's context carries none of the caller's values: wazero reads
	// experimental hooks from it, one of which (a socket config) would hand the guest
	// listening sockets. Only the caller's cancellation is passed on.
	base, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stopPropagating := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stopPropagating()
	tctx, tcancel := context.WithTimeoutCause(base, timeout, errExecTimeout)
	defer tcancel()
	untrack := p.trackExec(id, &execHandle{cancel: cancel})
	defer untrack()

	memory := newMemoryCap(rec.Config.MemoryBytes())
	fsc, _, sig := sandboxFS(mounts, prog.python)
	runCtx := withSpaceSignal(experimental.WithMemoryAllocator(tctx, memory), sig)
	mcfg := moduleConfig(tctx, prog.argv, prog.env, fsc, stdout, stderr)
	// A program a warm interpreter could serve runs on a pre-initialised one, when there
	// is one: its stdin starts with the request warm.py reads.
	var img *preinitImage
	if prog.python && warmServes(prog, mounts) {
		img = p.preinitFor(tctx, mounts, preinitStart{})
	}
	var in io.Reader
	if stdin != nil {
		r := cancellableReader(tctx, stdin)
		defer r.Close()
		in = r
	}
	if img != nil {
		mcfg = mcfg.WithStdin(withPreinitStdin(warmRequest(prog), in))
	} else if in != nil {
		mcfg = mcfg.WithStdin(in)
	}

	start := time.Now()
	mod, err := p.instantiate(runCtx, prog.module, mcfg)
	if err != nil {
		return roche.ExecResult{}, p.execStopped(ctx, tctx, id,
			fmt.Errorf("exec in wasm sandbox %s: instantiating %s: %w", id, prog.argv[0], err))
	}
	defer mod.Close(context.Background())
	if memory.OverAtStart() {
		return roche.ExecResult{}, overAtStart(prog, rec)
	}
	var callErr error
	if img != nil {
		callErr = p.enterPreinit(runCtx, mod, img)
		if errors.Is(callErr, errPreinitMemory) {
			return roche.ExecResult{}, overAtStart(prog, rec)
		}
	} else {
		_, callErr = mod.ExportedFunction("_start").Call(runCtx)
	}
	return outcome(ctx, tctx, id, rec, memory, callErr, stderr, start)
}

func overAtStart(prog program, rec record) error {
	return fmt.Errorf("%w: %s needs more memory at start than the sandbox's limit of %s: create the sandbox with more memory",
		roche.ErrInvalidConfig, prog.argv[0], rec.Config.Memory)
}

// dirQuota is the quota of one of the sandbox's own writable directories, with what
// recount needs to bring it up to date.
type dirQuota struct {
	*quota
	host string
	skip []string
}

// recount sets the bytes and entries used to what the directory holds now.
func (q dirQuota) recount() {
	used, entries := dirUsage(q.host, q.skip...)
	q.mu.Lock()
	q.used, q.entries = used, entries
	q.mu.Unlock()
}

// sandboxFS is the file system an instance sees: the sandbox's directories, each
// confined, its own writable ones under quota, and for Python the start-up hook. The
// quotas raise the signal returned, which the instance's calls must carry in their
// context (withSpaceSignal) for a refused write to fail with ENOSPC.
func sandboxFS(mounts []mountPoint, python bool) (wazero.FSConfig, []dirQuota, *spaceSignal) {
	fsc := wazero.NewFSConfig()
	sig := &spaceSignal{}
	var quotas []dirQuota
	for _, m := range mounts {
		var q *quota
		if m.own && !m.readOnly && m.limit > 0 {
			var skip []string
			if m.guest == "/" {
				// /tmp and /workspace live inside the root's directory but count on their own.
				for _, o := range mounts {
					if o.own && o.guest != "/" {
						skip = append(skip, o.host)
					}
				}
			}
			used, entries := dirUsage(m.host, skip...)
			q = &quota{used: used, limit: m.limit, entries: entries, maxEntries: entriesFor(m.limit), signal: sig}
			quotas = append(quotas, dirQuota{quota: q, host: m.host, skip: skip})
		}
		fsc = fsc.(sysfs.FSConfig).WithSysFSMount(newConfinedFS(m.host, m.readOnly, q, m.files, sig), m.guest)
	}
	if python {
		boot, _ := fs.Sub(bootFiles, "boot")
		fsc = fsc.(sysfs.FSConfig).WithSysFSMount(&sysfs.AdaptFS{FS: boot}, guestBoot)
	}
	return fsc, quotas, sig
}

// moduleConfig is how every instance starts; a sleep in the guest ends when ctx does.
// Stdin is the caller's to add.
func moduleConfig(ctx context.Context, argv []string, env map[string]string, fsc wazero.FSConfig, stdout, stderr io.Writer) wazero.ModuleConfig {
	mcfg := wazero.NewModuleConfig().
		// Anonymous, so that any number of execs can run in the runtime at once.
		WithName("").
		WithArgs(argv...).
		WithStdout(stdout).
		WithStderr(stderr).
		WithFSConfig(fsc).
		// wazero's defaults are deterministic fakes: a clock stuck in 2022 and a fixed
		// random seed, which would make every sandbox's os.urandom the same.
		WithSysWalltime().
		WithNanotime(guestNanotime, 1).
		WithRandSource(rand.Reader).
		// time.sleep must end at the timeout: a sleeping guest runs no code that could
		// notice the context, so the sleep itself has to.
		WithNanosleep(func(ns int64) { sleepCtx(ctx, time.Duration(ns)) }).
		// _start is called by the provider, so that a trap in it is told apart from a
		// module that could not be instantiated at all.
		WithStartFunctions()
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		mcfg = mcfg.WithEnv(k, env[k])
	}
	return mcfg
}

// outcome reports how a call of _start that began at start ended: ctx is the caller's,
// tctx the guest's, whose cause says whether it was stopped and why.
func outcome(ctx, tctx context.Context, id string, rec record, memory *memoryCap, callErr error,
	stderr io.Writer, start time.Time) (roche.ExecResult, error) {
	res := roche.ExecResult{Duration: time.Since(start)}
	if err := ctx.Err(); err != nil {
		return roche.ExecResult{}, fmt.Errorf("exec in wasm sandbox %s: %w", id, err)
	}
	switch cause := context.Cause(tctx); {
	case errors.Is(cause, errDestroyed):
		return roche.ExecResult{}, fmt.Errorf("%w: wasm sandbox %s was destroyed while the command ran", roche.ErrNotFound, id)
	case errors.Is(cause, errExecTimeout):
		// Even a guest that then exited by itself was cut short: its sleep or read ended early.
		res.TimedOut = true
		res.ExitCode = ExitCodeKilled
		return res, nil
	case errors.Is(cause, errClosed):
		return roche.ExecResult{}, fmt.Errorf("%w: exec in wasm sandbox %s: the provider was closed while the command ran", roche.ErrUnavailable, id)
	}

	var exit *sys.ExitError
	switch {
	case callErr == nil:
		res.ExitCode = 0
	case errors.As(callErr, &exit):
		res.ExitCode = int(exit.ExitCode())
	default:
		// A trap ends the program the way a fatal signal ends a process: it is the
		// command's outcome, told on stderr, not a failure to run it.
		res.ExitCode = ExitCodeTrap
		note := "roche: the wasm module trapped: " + trimTrace(callErr.Error())
		if memory.Refused() {
			note += fmt.Sprintf("\nroche: this came after the module was refused memory beyond the sandbox's %s limit", rec.Config.Memory)
		}
		_, _ = io.WriteString(stderr, "\n"+note+"\n")
	}
	// Nothing is killed for asking too much: memory.grow fails and the guest decides
	// (Python raises MemoryError). A command that then failed was stopped by the limit.
	res.OOMKilled = memory.Refused() && res.ExitCode != 0
	return res, nil
}

// execStopped turns an error into the one the caller should see when the exec was
// cancelled, timed out or its sandbox destroyed while starting.
func (p *Provider) execStopped(ctx, tctx context.Context, id string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("exec in wasm sandbox %s: %w", id, ctx.Err())
	}
	if errors.Is(context.Cause(tctx), errDestroyed) {
		return fmt.Errorf("%w: wasm sandbox %s was destroyed while the command started", roche.ErrNotFound, id)
	}
	return err
}

// trimTrace keeps the first lines of wazero's trap message and wasm stack trace.
func trimTrace(msg string) string {
	lines := strings.Split(strings.TrimSpace(msg), "\n")
	if len(lines) > trapTraceLines {
		lines = append(lines[:trapTraceLines], fmt.Sprintf("\t... %d more frames", len(lines)-trapTraceLines))
	}
	return strings.Join(lines, "\n")
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// cancellableReader feeds r to the guest through a pipe that is closed when ctx ends, so
// that a guest blocked reading stdin is released at its timeout even when r never
// returns. Close it when the exec is over. The goroutine copying from r ends once r's
// current Read returns.
func cancellableReader(ctx context.Context, r io.Reader) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		_, err := io.Copy(pw, r)
		pw.CloseWithError(err)
	}()
	stop := context.AfterFunc(ctx, func() { pr.CloseWithError(io.EOF) })
	return readCloser{Reader: pr, close: func() error {
		stop()
		return pr.CloseWithError(io.EOF)
	}}
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }
