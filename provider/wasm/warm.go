package wasm

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/tetratelabs/wazero/experimental"

	"github.com/roche-sandbox/roche"
)

// Warm start. Instantiating python.wasm and initialising CPython takes about 0.1 s, most
// of an exec of a short program. With WithWarmStart, every sandbox has one interpreter
// started ahead of its next exec, in the background: instantiated with the sandbox's
// directories and memory limit, initialised, and blocked reading a request on its stdin,
// which only the provider writes. An exec that the interpreter can serve exactly as a
// fresh `python3 -c CODE ARGS` or `python3 SCRIPT ARGS` would be served hands it the
// program, argv, environment and working directory; boot/warm.py sets the process up as
// a fresh interpreter would have it and runs the program. The exec's stdin, stdout,
// stderr, timeout and output caps are attached when it takes the interpreter, which
// exits with the program. An interpreter serves at most one exec and belongs to one
// sandbox, so nothing of one exec reaches another. Another is started shortly after
// each exec, unless the sandbox is destroyed first.
//
// An exec goes to a fresh instance instead when a warm one could tell: another spelling
// of the interpreter (its name shows in sys.executable), options before -c or the
// script, a script that is not a plain source file, text that is not UTF-8, or an
// environment variable CPython reads while it starts (readAtStart).
//
// What a program can still tell: its module-level frame has Roche's frames below it
// (sys._getframe().f_back is not None, so recursion runs out sooner): two when the
// interpreter started from a pre-initialised copy (preinit.go), three when it started
// from scratch; the garbage collector's counters, which the loader's few allocations
// moved; and a run that ends as CPython begins clearing its own state, once the
// program's streams are flushed and every module cleared (boot/warm.py's
// _arm_teardown, when the exit status is certain): a finaliser only that state still
// reaches does not run, and the program's own audit hooks see the loader's added.

// warmArgv0 is the name warm interpreters are started as; sys.executable and the
// start-up paths follow from it, so only execs naming the interpreter the same way are
// served warm.
const warmArgv0 = "python3"

// warmCommand runs boot/warm.py, passed as sys.argv[1], in a namespace of its own so
// that __main__ is left as a fresh interpreter has it.
const warmCommand = `exec(compile(__import__('sys').argv[1], '<roche-warm>', 'exec'), {'__name__': '__roche_warm__'})`

//go:embed boot/warm.py
var warmSource string

const (
	// warmDelay is how long after a create or an exec an interpreter starts, unless an
	// exec asks for it sooner. Starting one takes a CPU for about 0.1 s: the delay lets
	// the exec that typically follows a create (or a destroy that follows an exec) run
	// without it, and costs an exec that comes sooner nothing, since it starts the
	// interpreter at once.
	warmDelay = 50 * time.Millisecond
	// earlyOutputLimit bounds what an interpreter may print before it is handed an exec.
	earlyOutputLimit = 64 << 10
	// maxWarmScript bounds the script read to check it can be served warm.
	maxWarmScript = 1 << 20
)

var (
	errExpired = errors.New("sandbox expired")
	errStale   = errors.New("the sandbox's mounts changed")
)

// warmInstance is one interpreter started ahead of an exec.
type warmInstance struct {
	id     string
	ctx    context.Context // its life; cancelled with a cause to stop it
	cancel context.CancelCauseFunc
	memory *memoryCap
	stdin  *warmStdin
	stdout *handoffWriter
	stderr *handoffWriter

	mu      sync.Mutex
	state   warmState
	mounts  []mountPoint // as it was given them; set before it is instantiated
	quotas  []dirQuota
	claimed chan struct{} // closed when an exec takes it
	ready   chan struct{} // closed when it waits for its request
	done    chan struct{} // closed when it has ended; err and callErr are set then
	err     error         // it could not be started
	callErr error         // how _start ended
}

type warmState int

const (
	warmWaiting warmState = iota
	warmClaimed
	warmDead
)

// claim takes the instance for an exec, unless it has already ended or been taken.
func (w *warmInstance) claim() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != warmWaiting {
		return false
	}
	select {
	case <-w.done:
		w.state = warmDead
		return false
	default:
	}
	w.state = warmClaimed
	close(w.claimed)
	return true
}

// kill stops an instance no exec has taken; a claimed one is the exec's to stop.
func (w *warmInstance) kill(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state == warmWaiting {
		w.state = warmDead
		w.cancel(cause)
	}
}

// WarmStats describes the interpreters started ahead of execs (see WithWarmStart).
type WarmStats struct {
	// Ready interpreters wait for an exec; Starting ones are being instantiated or
	// initialised (or wait for a slot to start in).
	Ready, Starting int
	// Served counts the execs run on an interpreter started ahead of them.
	Served uint64
}

// WarmStats reports the warm interpreters; all zero without WithWarmStart.
func (p *Provider) WarmStats() WarmStats {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	st := WarmStats{Served: p.warmServed}
	for _, w := range p.warm {
		select {
		case <-w.ready:
			st.Ready++
		default:
			st.Starting++
		}
	}
	return st
}

// startWarm starts an interpreter for the sandbox rec after delay, unless warm start is
// off, the sandbox has one or is gone, or the provider is closing.
func (p *Provider) startWarm(rec record, delay time.Duration) {
	if !p.warmStart {
		return
	}
	until := time.Until(rec.ExpiresAt)
	if until <= 0 {
		return
	}
	p.runMu.Lock()
	defer p.runMu.Unlock()
	if p.closed || p.warm[rec.ID] != nil {
		return
	}
	// Checked under runMu, which Destroy takes after removing the record: either this
	// sees the sandbox gone, or Destroy finds the instance and stops it.
	if _, err := os.Lstat(filepath.Join(p.sandboxDir(rec.ID), recordFile)); err != nil {
		return
	}
	ctx, cancel := context.WithCancelCause(p.life)
	w := &warmInstance{
		id: rec.ID, ctx: ctx, cancel: cancel,
		memory:  newMemoryCap(rec.Config.MemoryBytes()),
		stdout:  &handoffWriter{},
		stderr:  &handoffWriter{},
		claimed: make(chan struct{}),
		ready:   make(chan struct{}),
		done:    make(chan struct{}),
	}
	w.stdin = &warmStdin{ctx: ctx, given: make(chan struct{}), ready: sync.OnceFunc(func() { close(w.ready) })}
	w.stdin.taken = func() {
		// Called by the guest's first read of the request: everything it writes from now
		// on is the exec's.
		w.stdout.handoff()
		w.stderr.handoff()
	}
	p.warm[rec.ID] = w
	p.bg.Add(1)
	go p.runWarm(w, rec, until, delay)
}

// stopWarm stops the sandbox's waiting interpreter, if it has one.
func (p *Provider) stopWarm(id string, cause error) {
	p.runMu.Lock()
	w := p.warm[id]
	delete(p.warm, id)
	p.runMu.Unlock()
	if w != nil {
		w.kill(cause)
	}
}

// takeWarm hands the sandbox's interpreter to an exec, or returns nil.
func (p *Provider) takeWarm(id string) *warmInstance {
	p.runMu.Lock()
	w := p.warm[id]
	delete(p.warm, id)
	p.runMu.Unlock()
	if w == nil || !w.claim() {
		return nil
	}
	return w
}

// runWarm starts the interpreter and runs it until it has served its exec, or is stopped.
func (p *Provider) runWarm(w *warmInstance, rec record, until, delay time.Duration) {
	defer p.bg.Done()
	defer func() {
		p.runMu.Lock()
		if p.warm[w.id] == w {
			delete(p.warm, w.id)
		}
		p.runMu.Unlock()
		w.stdin.ready() // nothing waits for it any more
		w.cancel(nil)
		close(w.done)
	}()
	// An interpreter no exec took is stopped at the sandbox's expiry.
	expiry := time.AfterFunc(until, func() { w.kill(errExpired) })
	defer expiry.Stop()

	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-w.claimed:
		case <-w.ctx.Done():
		}
		t.Stop()
	}
	// Starting interpreters take a CPU each for about 0.1 s: a bounded number start at
	// once, so that filling a pool does not starve the execs running. One an exec has
	// already taken goes first.
	select {
	case p.warmSlots <- struct{}{}:
		release := sync.OnceFunc(func() { <-p.warmSlots })
		defer release()
		w.stdin.onReady = release
	case <-w.claimed:
	case <-w.ctx.Done():
	}
	if err := w.ctx.Err(); err != nil {
		w.err = context.Cause(w.ctx)
		return
	}

	mod, err := p.pythonModule(w.ctx)
	if err != nil {
		w.err = err
		return
	}
	mounts, err := p.sandboxMounts(w.id, rec.Config)
	if err != nil {
		w.err = err
		return
	}
	img := p.preinitFor(w.ctx, mounts, preinitStart{})
	fsc, quotas, sig := sandboxFS(mounts, true)
	w.mu.Lock()
	w.mounts, w.quotas = mounts, quotas
	w.mu.Unlock()
	// PYTHONPATH brings in the start-up hook, as for every Python exec; the hook removes
	// it from the environment, which warm.py then replaces with the exec's.
	env := map[string]string{"PYTHONPATH": guestBoot}
	mcfg := moduleConfig(w.ctx, []string{warmArgv0, "-c", warmCommand, warmSource}, env, fsc, w.stdout, w.stderr).
		WithStdin(w.stdin)
	runCtx := withSpaceSignal(experimental.WithMemoryAllocator(w.ctx, w.memory), sig)
	inst, err := p.instantiate(runCtx, mod, mcfg)
	if err != nil {
		w.err = err
		return
	}
	defer inst.Close(context.Background())
	if w.memory.OverAtStart() {
		w.err = errors.New("python.wasm needs more memory at start than the sandbox's limit")
		return
	}
	if img != nil {
		w.callErr = p.enterPreinit(runCtx, inst, img)
	} else {
		_, w.callErr = inst.ExportedFunction("_start").Call(runCtx)
	}
}

// execWarm runs prog on the sandbox's warm interpreter w, which the caller has claimed.
// served is false when w could not take the exec (it had ended, or the sandbox's mounts
// changed since it started): nothing ran, and the caller runs prog fresh.
func (p *Provider) execWarm(ctx context.Context, w *warmInstance, rec record, mounts []mountPoint, prog program,
	req roche.ExecRequest, stdout, stderr io.Writer, timeout time.Duration) (res roche.ExecResult, served bool, err error) {
	// Started before the exec was asked for, so the directories it resolved then must
	// still be the ones an exec would get now.
	w.mu.Lock()
	wmounts, quotas := w.mounts, w.quotas
	w.mu.Unlock()
	if wmounts != nil && !slices.Equal(wmounts, mounts) {
		w.cancel(errStale)
		<-w.done
		return roche.ExecResult{}, false, nil
	}
	// Files may have come and gone since: the quotas start from what is there now.
	for _, q := range quotas {
		q.recount()
	}

	untrack := p.trackExec(rec.ID, &execHandle{cancel: w.cancel})
	defer untrack()
	stopPropagating := context.AfterFunc(ctx, func() { w.cancel(context.Cause(ctx)) })
	defer stopPropagating()
	timer := time.AfterFunc(timeout, func() { w.cancel(errExecTimeout) })
	defer timer.Stop()

	var in io.Reader
	if req.Stdin != nil {
		r := cancellableReader(w.ctx, req.Stdin)
		defer r.Close()
		in = r
	}
	w.stdout.target(stdout)
	w.stderr.target(stderr)
	start := time.Now()
	w.stdin.give(warmRequest(prog), in)
	<-w.done

	if !w.stdin.wasTaken() {
		cause := context.Cause(w.ctx)
		if ctx.Err() == nil && !errors.Is(cause, errExecTimeout) && !errors.Is(cause, errDestroyed) && !errors.Is(cause, errClosed) {
			// It ended by itself before reading the request: broken, not the program's
			// doing, and nothing of the program ran.
			p.log.Warn("wasm: a warm interpreter ended before its exec; running the exec fresh", "id", rec.ID,
				"err", errors.Join(w.err, w.callErr), "stderr", strings.TrimSpace(string(w.stderr.earlyOutput())))
			return roche.ExecResult{}, false, nil
		}
		// Stopped while it started (a timeout, the caller, a destroy): the cause decides.
	}
	p.runMu.Lock()
	p.warmServed++
	p.runMu.Unlock()
	res, err = outcome(ctx, w.ctx, rec.ID, rec, w.memory, w.callErr, stderr, start)
	return res, true, err
}

// warmRequest encodes prog for boot/warm.py. Options before -c (a code context's
// kernel's, kernel.StdioArgv) are the interpreter's: it was started or copied with them.
func warmRequest(prog program) []byte {
	kind := "f"
	for _, a := range prog.argv[1:] {
		if a == "-c" {
			kind = "c"
		}
		if a == "-c" || !strings.HasPrefix(a, "-") {
			break
		}
	}
	fields := append([]string{kind, prog.workdir, strconv.Itoa(len(prog.argv))}, prog.argv...)
	for _, k := range slices.Sorted(maps.Keys(prog.userEnv)) {
		fields = append(fields, k+"="+prog.userEnv[k])
	}
	payload := strings.Join(fields, "\x00")
	return fmt.Appendf(nil, "%010d%s", len(payload), payload)
}

// warmServes reports whether a warm interpreter runs prog exactly as a fresh one would.
func warmServes(prog program, mounts []mountPoint) bool {
	if !prog.python || len(prog.argv) < 2 || prog.argv[0] != warmArgv0 || !plainText(prog.workdir) {
		return false
	}
	for _, a := range prog.argv {
		if !plainText(a) {
			return false
		}
	}
	for k, v := range prog.userEnv {
		if readAtStart(k) || !plainText(k) || !plainText(v) {
			return false
		}
	}
	switch a := prog.argv[1]; {
	case a == "-c":
		return len(prog.argv) >= 3
	case strings.HasPrefix(a, "-"):
		return false // options change how the interpreter starts
	default:
		return plainScript(mounts, a)
	}
}

// plainText: UTF-8 without NUL, which argv and the environment cannot carry.
func plainText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// readAtStart reports whether CPython, or the site module it imports, reads the
// environment variable while the interpreter starts, before the program runs. A warm
// interpreter started without it, so an exec setting one runs fresh.
func readAtStart(k string) bool {
	switch {
	case strings.HasPrefix(k, "PYTHON"), strings.HasPrefix(k, "LC_"), strings.HasPrefix(k, "ROCHE_WASM_"):
		return true
	}
	switch k {
	case "LANG", "LANGUAGE", "PATH", "HOME", "TZ":
		return true
	}
	return false
}

// plainScript reports whether the guest path names a source file that CPython would run
// as such: a regular file reached without symlinks, not compiled code (which holds NUL
// bytes) and not a zip archive (run through its __main__.py).
func plainScript(mounts []mountPoint, guest string) bool {
	// CPython takes sys.path[0] from the script's real path; warm.py from the path as
	// given, which is the same only when it is clean.
	if !path.IsAbs(guest) || path.Clean(guest) != guest {
		return false
	}
	m, rel := resolve(mounts, guest)
	if rel == "" {
		return false
	}
	cur := m.host
	parts := strings.Split(rel, "/")
	for i, part := range parts {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if err != nil {
			return false
		}
		last := i == len(parts)-1
		if !last && !fi.IsDir() || last && (!fi.Mode().IsRegular() || fi.Size() > maxWarmScript) {
			return false
		}
	}
	b, err := os.ReadFile(cur)
	if err != nil || len(b) > maxWarmScript {
		return false
	}
	return bytes.IndexByte(b, 0) < 0 && !bytes.Contains(b, []byte("PK\x05\x06"))
}

// warmStdin is a warm interpreter's stdin: it blocks until an exec gives the request,
// serves it, then the exec's stdin (or end of file when it has none).
type warmStdin struct {
	ctx     context.Context
	given   chan struct{}
	ready   func() // closes the instance's ready channel
	onReady func() // set before the guest starts; releases its start slot
	taken   func() // called at the guest's first read of the request

	mu        sync.Mutex
	req       []byte
	next      io.Reader
	readStart bool
}

// give hands the interpreter its request and the exec's stdin.
func (s *warmStdin) give(req []byte, next io.Reader) {
	s.mu.Lock()
	s.req, s.next = req, next
	s.mu.Unlock()
	close(s.given)
}

func (s *warmStdin) wasTaken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readStart
}

// Read implements io.Reader for the guest.
func (s *warmStdin) Read(b []byte) (int, error) {
	select {
	case <-s.given:
	default:
		// The interpreter has initialised and asks for its request.
		s.ready()
		if s.onReady != nil {
			s.onReady()
		}
		select {
		case <-s.given:
		case <-s.ctx.Done():
			return 0, io.EOF
		}
	}
	s.mu.Lock()
	if len(s.req) > 0 {
		if !s.readStart {
			s.readStart = true
			s.taken()
		}
		n := copy(b, s.req)
		s.req = s.req[n:]
		s.mu.Unlock()
		return n, nil
	}
	next := s.next
	s.mu.Unlock()
	if next == nil {
		return 0, io.EOF
	}
	return next.Read(b)
}

// handoffWriter is a warm interpreter's stdout or stderr: what it writes before it takes
// its exec's request is kept (up to earlyOutputLimit) and passed on first; after, writes
// go to the exec's writer.
type handoffWriter struct {
	mu    sync.Mutex
	next  io.Writer // the exec's, once one has taken the interpreter
	live  bool      // writes go to next
	early []byte
}

// target sets where output goes once the request is taken.
func (h *handoffWriter) target(w io.Writer) {
	h.mu.Lock()
	h.next = w
	h.mu.Unlock()
}

// handoff sends what was written so far to the target, and everything after.
func (h *handoffWriter) handoff() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.next == nil || h.live {
		return
	}
	h.live = true
	if len(h.early) > 0 {
		_, _ = h.next.Write(h.early)
		h.early = nil
	}
}

func (h *handoffWriter) earlyOutput() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.early)
}

// Write implements io.Writer for the guest.
func (h *handoffWriter) Write(b []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.live {
		return h.next.Write(b)
	}
	if room := earlyOutputLimit - len(h.early); room > 0 {
		h.early = append(h.early, b[:min(len(b), room)]...)
	}
	return len(b), nil
}

// warmOf is for tests: whether a sandbox has a warm interpreter, and whether it is ready.
func (p *Provider) warmOf(id string) (has, ready bool) {
	p.runMu.Lock()
	defer p.runMu.Unlock()
	w := p.warm[id]
	if w == nil {
		return false, false
	}
	select {
	case <-w.ready:
		return true, true
	default:
		return true, false
	}
}
