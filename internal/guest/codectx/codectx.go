// Package codectx is the one implementation of code contexts: long-lived Python
// interpreters (the kernel of internal/guest/kernel) that keep their variables from one
// cell to the next. A Set holds a sandbox's contexts: it makes them and the language's
// default one, names them, starts, restarts and replaces their kernels, hands over a
// kernel started ahead (warm), runs cells (one at a time per context) with their
// timeout, interrupt, output limit, results and execution count, and says how a kernel
// that died in a cell died and that the next cell runs in a fresh one (Restarted).
//
// roche-agent (internal/guest/server) runs each kernel as a process in the sandbox and
// the wasm provider as an instance of python.wasm; each gives the Set only how to start
// one (Options.Start, a Proc) and stays free of the rest. The package itself does no
// process handling, so that it serves both. It speaks the agent protocol's types
// (guest.CodeContext, guest.CodeEnd, guest.Error), which the wasm provider turns into the
// core's as the providers forwarding to roche-agent do.
package codectx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/kernel"
)

const (
	languagePython = "python"
	// interruptGrace is how long a cell interrupted at its timeout (a KeyboardInterrupt)
	// has to stop before its interpreter is killed.
	interruptGrace = 3 * time.Second
	// syncGrace bounds the wait, after a cell ends, for what its subprocesses wrote to
	// the raw stdout and stderr pipes before that (the kernel's sync marks).
	syncGrace = time.Second
	// DefaultOutputLimit caps each stream of a cell that gives no limit.
	DefaultOutputLimit = 10 << 20
)

// Options are what a platform gives a Set.
type Options struct {
	// Start starts a kernel with cwd (empty: the sandbox's workdir) and env added to the
	// sandbox's environment, and returns it once started (NewKernel, its streams fed);
	// the Set waits for it to be ready. ctx bounds the start only.
	Start func(ctx context.Context, cwd string, env map[string]string) (*Kernel, error)
	// Stopping, when set, says why the sandbox is stopping, "" while it serves: no
	// context or kernel is made then.
	Stopping func() string
	// Lost, when set, says whether a new default context of language starts lost: its
	// first cell says Restarted (the wasm provider's default context that ran cells in
	// another process, which this one cannot reach).
	Lost func(language string) bool
	// Record, when set, is told of a context in use (made by Create, or its first cell
	// run) and of one removed (Remove).
	Record func(cc guest.CodeContext, removed bool)
	// Unknown, when set, may give the error for a context id the Set does not hold; nil
	// keeps the Set's own.
	Unknown func(id string) error
	// Fork, when set, forks parent (Set.Fork): it readies what the new kernel takes
	// its fds from, calls request with its address (the Set sends parent the fork
	// line), and returns the new kernel once it has them (NewKernel, its streams fed).
	// nil: the platform's kernels cannot fork, and Set.Fork says so.
	Fork func(ctx context.Context, parent *Kernel, request func(addr string) error) (*Kernel, error)
}

// Set is a sandbox's code contexts.
type Set struct {
	opts Options

	mu       sync.Mutex
	contexts map[string]*codeContext
	spare    *spare // a kernel started ahead of its context (Warm), or nil
	stopped  bool
	// defaults makes a language's default context once, even when two first calls race.
	defaults sync.Mutex
}

// New returns an empty Set.
func New(opts Options) *Set {
	return &Set{opts: opts, contexts: map[string]*codeContext{}}
}

// codeContext is one context.
type codeContext struct {
	guest.CodeContext
	env map[string]string // added to the sandbox's environment for the interpreter

	// run is held while a cell runs and while the interpreter is replaced.
	run sync.Mutex
	// mu guards what follows, for restart and remove, which stop the interpreter while
	// a cell runs.
	mu sync.Mutex
	k  *Kernel
	// lost: the interpreter died (or lived elsewhere); the next cell starts a fresh one
	// and says Restarted.
	lost    bool
	removed bool
	cells   int
	forks   int // fork requests sent to its interpreter
}

func (cx *codeContext) kernel() *Kernel {
	cx.mu.Lock()
	defer cx.mu.Unlock()
	return cx.k
}

// spare is a kernel started before any context wanted it, and what it was started
// with: a context takes it only if it would start its own the same way.
type spare struct {
	k        *Kernel
	language string
	cwd      string
	env      map[string]string
}

func invalid(format string, args ...any) error {
	return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &guest.Error{Code: guest.CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

func stoppingError(why string) error {
	return &guest.Error{Code: guest.CodeStopping, Message: "the sandbox is stopping: " + why}
}

// checkLanguage returns the language a context of lang runs, or why there is none.
func checkLanguage(lang string) (string, error) {
	switch lang {
	case "", languagePython:
		return languagePython, nil
	case "bash", "javascript", "js", "node", "typescript":
		return "", &guest.Error{Code: guest.CodeUnsupported, Message: fmt.Sprintf(
			"%s contexts are not served (only python): run %s programs with exec instead", lang, lang)}
	}
	return "", invalid("unknown code language %q (the languages served: python)", lang)
}

// stopping says why no context or kernel may be made, "" when they may. s.mu is held.
func (s *Set) stopping() string {
	if s.opts.Stopping != nil {
		if why := s.opts.Stopping(); why != "" {
			return why
		}
	}
	if s.stopped {
		return "its code contexts were stopped"
	}
	return ""
}

// Create makes a context and starts its interpreter.
func (s *Set) Create(ctx context.Context, lang, cwd string, env map[string]string) (guest.CodeContext, error) {
	cx, err := s.newContext(lang, cwd, env, false, false)
	if err != nil {
		return guest.CodeContext{}, err
	}
	cx.run.Lock()
	_, err = s.ensureKernel(ctx, cx)
	cx.run.Unlock()
	if err != nil {
		s.drop(cx)
		return guest.CodeContext{}, err
	}
	if s.opts.Record != nil {
		s.opts.Record(cx.CodeContext, false)
	}
	return cx.CodeContext, nil
}

// newContext makes a context (its interpreter starts on its first cell).
func (s *Set) newContext(lang, cwd string, env map[string]string, isDefault, lost bool) (*codeContext, error) {
	lang, err := checkLanguage(lang)
	if err != nil {
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	cx := &codeContext{CodeContext: guest.CodeContext{ID: hex.EncodeToString(b[:]), Language: lang, Cwd: cwd, Default: isDefault}, env: env, lost: lost}
	s.mu.Lock()
	defer s.mu.Unlock()
	if why := s.stopping(); why != "" {
		return nil, stoppingError(why)
	}
	s.contexts[cx.ID] = cx
	return cx, nil
}

// defaultContext returns the language's default context, made on first use.
func (s *Set) defaultContext(lang, cwd string, env map[string]string) (*codeContext, error) {
	lang, err := checkLanguage(lang)
	if err != nil {
		return nil, err
	}
	if cx := s.findDefault(lang); cx != nil {
		return cx, nil
	}
	s.defaults.Lock()
	defer s.defaults.Unlock()
	if cx := s.findDefault(lang); cx != nil {
		return cx, nil
	}
	lost := s.opts.Lost != nil && s.opts.Lost(lang)
	return s.newContext(lang, cwd, env, true, lost)
}

func (s *Set) findDefault(lang string) *codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cx := range s.contexts {
		if cx.Default && cx.Language == lang {
			return cx
		}
	}
	return nil
}

func (s *Set) context(id string) (*codeContext, error) {
	s.mu.Lock()
	cx, ok := s.contexts[id]
	s.mu.Unlock()
	if ok {
		return cx, nil
	}
	if s.opts.Unknown != nil {
		if err := s.opts.Unknown(id); err != nil {
			return nil, err
		}
	}
	return nil, notFound("no code context %q in this sandbox", id)
}

// List describes the contexts, by id.
func (s *Set) List() []guest.CodeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []guest.CodeContext{}
	for _, cx := range s.contexts {
		out = append(out, cx.CodeContext)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Restart replaces a context's interpreter with a fresh one; a cell it runs ends, its
// interpreter died ("restarted").
func (s *Set) Restart(ctx context.Context, id string) error {
	cx, err := s.context(id)
	if err != nil {
		return err
	}
	if k := cx.kernel(); k != nil {
		k.Stop("restarted")
	}
	cx.run.Lock()
	defer cx.run.Unlock()
	cx.mu.Lock()
	cx.k, cx.lost = nil, false
	cx.mu.Unlock()
	_, err = s.ensureKernel(ctx, cx)
	return err
}

// Remove stops a context's interpreter and forgets the context.
func (s *Set) Remove(id string) error {
	cx, err := s.context(id)
	if err != nil {
		return err
	}
	if s.drop(cx) && s.opts.Record != nil {
		s.opts.Record(cx.CodeContext, true)
	}
	return nil
}

// drop stops a context's interpreter and forgets it; false if it was gone already.
func (s *Set) drop(cx *codeContext) bool {
	s.mu.Lock()
	_, held := s.contexts[cx.ID]
	delete(s.contexts, cx.ID)
	s.mu.Unlock()
	cx.mu.Lock()
	cx.removed = true
	k := cx.k
	cx.mu.Unlock()
	if k != nil {
		k.Stop("removed")
	}
	return held
}

// Warm starts the spare interpreter (replacing one there was) with cwd and env, and
// returns once it is ready. The next context of lang started the same way takes it.
func (s *Set) Warm(ctx context.Context, lang, cwd string, env map[string]string) error {
	lang, err := checkLanguage(lang)
	if err != nil {
		return err
	}
	k, err := s.start(ctx, cwd, env)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old, why := s.spare, s.stopping()
	s.spare = nil
	if why == "" {
		s.spare = &spare{k: k, language: lang, cwd: cwd, env: env}
	}
	s.mu.Unlock()
	if old != nil {
		old.k.Stop("replaced")
	}
	if why != "" {
		k.Stop("stopped with the sandbox")
		return stoppingError(why)
	}
	return nil
}

// takeSpare hands over the spare interpreter if it runs lang and was started with cwd
// and env, as the caller would start its own; else nil, and the spare stays.
func (s *Set) takeSpare(lang, cwd string, env map[string]string) *Kernel {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spare
	if sp == nil || sp.language != lang || sp.cwd != cwd || !maps.Equal(sp.env, env) {
		return nil
	}
	s.spare = nil
	select {
	case <-sp.k.Ended(): // died waiting (the OOM killer): not worth handing over
		go sp.k.Stop("")
		return nil
	default:
		return sp.k
	}
}

// Stop kills every context's interpreter, and the spare, and refuses new ones: the
// sandbox is stopping.
func (s *Set) Stop() {
	s.mu.Lock()
	s.stopped = true
	list := make([]*codeContext, 0, len(s.contexts))
	for _, cx := range s.contexts {
		list = append(list, cx)
	}
	sp := s.spare
	s.spare = nil
	s.mu.Unlock()
	if sp != nil {
		sp.k.Stop("stopped with the sandbox")
	}
	for _, cx := range list {
		if k := cx.kernel(); k != nil {
			k.Stop("stopped with the sandbox")
		}
	}
}

// Fork makes a new context holding a copy of context id's interpreter, its variables
// included (the kernel forks itself), in the same sandbox; the two go on apart. It
// waits for a cell running in id to end. A context whose interpreter has not started,
// or died, forks as a fresh one.
func (s *Set) Fork(ctx context.Context, id string) (guest.CodeContext, error) {
	if s.opts.Fork == nil {
		return guest.CodeContext{}, &guest.Error{Code: guest.CodeUnsupported, Message: "this platform's interpreters cannot fork themselves: make a new context and run the cells again"}
	}
	src, err := s.context(id)
	if err != nil {
		return guest.CodeContext{}, err
	}
	cx, err := s.newContext(src.Language, src.Cwd, src.env, false, false)
	if err != nil {
		return guest.CodeContext{}, err
	}
	err = s.fork(ctx, src, cx)
	if err != nil {
		s.drop(cx)
		return guest.CodeContext{}, err
	}
	if s.opts.Record != nil {
		s.opts.Record(cx.CodeContext, false)
	}
	return cx.CodeContext, nil
}

// fork gives cx a fork of src's interpreter, or a fresh one when src has none running.
func (s *Set) fork(ctx context.Context, src, cx *codeContext) error {
	src.run.Lock()
	defer src.run.Unlock()
	parent := src.kernel()
	if parent == nil || parent.gone() {
		cx.run.Lock()
		defer cx.run.Unlock()
		_, err := s.ensureKernel(ctx, cx)
		return err
	}
	src.mu.Lock()
	src.forks++
	rid := -src.forks // no cell has a negative id
	src.mu.Unlock()
	var early collected
	run := &cellRun{out: &early, limit: earlyOutput}
	parent.setCell(run)
	defer parent.setCell(nil)
	sent := make(chan error, 1)
	child, err := s.opts.Fork(ctx, parent, func(addr string) error {
		err := parent.send(kernel.ForkLine(addr, rid))
		sent <- err
		return err
	})
	// The parent ends the request (done) whatever came of it; its events are read up to
	// there, so that none is left for its next cell.
	var ferr *guest.CodeError
	if len(sent) > 0 && <-sent == nil {
		ferr = parent.awaitDone(ctx, rid)
	}
	if err != nil {
		return err
	}
	if ferr != nil {
		child.Stop("")
		return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf("forking code context %s: %s: %s", src.ID, ferr.Name, ferr.Value)}
	}
	if err := child.waitReady(ctx); err != nil {
		return err
	}
	cx.mu.Lock()
	defer cx.mu.Unlock()
	s.mu.Lock()
	why := s.stopping()
	s.mu.Unlock()
	if why != "" || cx.removed {
		child.Stop("stopped with the sandbox")
		return stoppingError(why)
	}
	cx.k = child
	return nil
}

// reseedWait bounds Reseed's wait for the kernels' pipes to take the line.
const reseedWait = 2 * time.Second

// Reseed has every interpreter (each context's and the spare) reseed Python's random
// module (and numpy's legacy generator) from os.urandom before its next cell: after a
// restore from a memory snapshot, every copy would otherwise draw the numbers the
// others draw. A cell running now goes on with the old state until it ends. It returns
// once the line is written to each, which the kernel reads before any later cell.
func (s *Set) Reseed() {
	// cx.mu is taken before s.mu elsewhere (ensureKernel): not under it here.
	s.mu.Lock()
	list := make([]*codeContext, 0, len(s.contexts))
	for _, cx := range s.contexts {
		list = append(list, cx)
	}
	var ks []*Kernel
	if s.spare != nil {
		ks = append(ks, s.spare.k)
	}
	s.mu.Unlock()
	for _, cx := range list {
		if k := cx.kernel(); k != nil {
			ks = append(ks, k)
		}
	}
	var wg sync.WaitGroup
	for _, k := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = k.send(kernel.ReseedLine) // a kernel gone needs no seed
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(reseedWait):
	}
}

// Spare returns the spare interpreter, or nil.
func (s *Set) Spare() *Kernel {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spare == nil {
		return nil
	}
	return s.spare.k
}

// Kernel returns the interpreter of context id, or nil.
func (s *Set) Kernel(id string) *Kernel {
	s.mu.Lock()
	cx := s.contexts[id]
	s.mu.Unlock()
	if cx == nil {
		return nil
	}
	return cx.kernel()
}

// start starts a kernel and waits until it is ready.
func (s *Set) start(ctx context.Context, cwd string, env map[string]string) (*Kernel, error) {
	k, err := s.opts.Start(ctx, cwd, env)
	if err != nil {
		return nil, err
	}
	if err := k.waitReady(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// ensureKernel returns the context's interpreter, started if it has none running.
// cx.run is held.
func (s *Set) ensureKernel(ctx context.Context, cx *codeContext) (*Kernel, error) {
	cx.mu.Lock()
	removed, k := cx.removed, cx.k
	cx.mu.Unlock()
	if removed {
		return nil, notFound("code context %s was removed", cx.ID)
	}
	if k != nil {
		if !k.gone() {
			return k, nil
		}
		// It died between cells: a fresh one, and the next cell says so.
		k.Stop("")
		cx.mu.Lock()
		cx.k, cx.lost = nil, true
		cx.mu.Unlock()
	}
	k = s.takeSpare(cx.Language, cx.Cwd, cx.env)
	if k == nil {
		var err error
		if k, err = s.start(ctx, cx.Cwd, cx.env); err != nil {
			return nil, err
		}
	}
	cx.mu.Lock()
	defer cx.mu.Unlock()
	if cx.removed {
		k.Stop("removed")
		return nil, notFound("code context %s was removed", cx.ID)
	}
	// Under cx.mu, so that Stop, which reads cx.k under it, either sees this kernel or
	// was seen here.
	s.mu.Lock()
	why := s.stopping()
	s.mu.Unlock()
	if why != "" {
		k.Stop("stopped with the sandbox")
		return nil, stoppingError(why)
	}
	cx.k = k
	return k, nil
}

// Run runs one cell (req's Code, Context or Language, Cwd and Env for a default context
// it makes, TimeoutMS, OutputLimit), streaming its output and results to out, and
// returns its end. ctx ending (the caller went away) interrupts the cell, as its
// timeout does. An error means the cell could not run (no such context, a language
// not served, an interpreter that would not start); how the cell failed is in the end.
func (s *Set) Run(ctx context.Context, req guest.Request, out Output) (guest.CodeEnd, error) {
	start := time.Now()
	var cx *codeContext
	var err error
	if req.Context != "" {
		cx, err = s.context(req.Context)
		if err == nil && req.Language != "" {
			if lang, lerr := checkLanguage(req.Language); lerr != nil || lang != cx.Language {
				err = invalid("code context %s runs %s, not %s", cx.ID, cx.Language, req.Language)
			}
		}
	} else {
		cx, err = s.defaultContext(req.Language, req.Cwd, req.Env)
	}
	if err != nil {
		return guest.CodeEnd{}, err
	}
	cx.run.Lock()
	defer cx.run.Unlock()
	k, err := s.ensureKernel(ctx, cx)
	if err != nil {
		return guest.CodeEnd{}, err
	}
	end := guest.CodeEnd{Context: cx.ID}
	cx.mu.Lock()
	end.Restarted = cx.lost
	cx.lost = false
	cx.cells++
	id := cx.cells
	cx.mu.Unlock()
	if id == 1 && cx.Default && s.opts.Record != nil { // Create recorded the others
		s.opts.Record(cx.CodeContext, false)
	}

	limit := req.OutputLimit
	if limit <= 0 {
		limit = DefaultOutputLimit
	}
	run := &cellRun{out: out, limit: limit}
	k.setCell(run)
	defer k.setCell(nil)
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	gone := ctx.Done()
	var grace <-chan time.Time
	// uninterruptible: why the kernel could not be interrupted at the cell's timeout
	// (it was stopped instead); killed: it did not stop within interruptGrace.
	var uninterruptible error
	killed := false
	interrupt := func(atTimeout bool) {
		if grace != nil {
			return
		}
		if err := k.proc.Interrupt(); err != nil {
			if atTimeout {
				uninterruptible = err
			}
			k.Stop("")
			return
		}
		grace = time.After(interruptGrace)
	}
	line := kernel.Cell{ID: id, Code: req.Code}.Line()
	go func() {
		if err := k.send(line); err != nil {
			k.Stop("") // it is dying already; the loop below sees its events end
		}
	}()
	done := false
loop:
	for {
		select {
		case ev, ok := <-k.events:
			if !ok {
				break loop
			}
			switch ev.T {
			case kernel.EventStdout:
				run.write(Stdout, []byte(ev.S))
			case kernel.EventStderr:
				run.write(Stderr, []byte(ev.S))
			case kernel.EventResult:
				run.result(ev)
			case kernel.EventError:
				end.Error = &guest.CodeError{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
			case kernel.EventDone:
				if ev.ID == id {
					end.ExecutionCount = ev.Count
					done = true
					break loop
				}
			}
		case <-timer:
			timer = nil
			end.TimedOut = true
			interrupt(true)
		case <-gone:
			gone = nil
			interrupt(false)
		case <-grace:
			grace = nil
			killed = true
			k.Stop("")
		}
	}
	if done {
		k.awaitMarks(id)
	} else {
		s.died(cx, k, &end, killed, uninterruptible, timeout)
	}
	end.DurationNS = time.Since(start).Nanoseconds()
	end.Truncated = run.wasTruncated()
	return end, nil
}

// died records, in end, how the kernel died in the middle of a cell; the context's next
// cell starts a fresh one.
func (s *Set) died(cx *codeContext, k *Kernel, end *guest.CodeEnd, killed bool, uninterruptible error, timeout time.Duration) {
	k.Stop("") // its subprocesses go with it
	exit := k.proc.Exit()
	cx.mu.Lock()
	if cx.k == k {
		cx.k = nil
		cx.lost = true
	}
	cx.mu.Unlock()
	end.Died = true
	why := k.stopReason()
	const fresh = "the next call starts a fresh context"
	switch {
	case uninterruptible != nil:
		end.Error = &guest.CodeError{Name: "TimeoutError", Value: fmt.Sprintf(
			"the cell was stopped at its timeout of %s: %v, so its interpreter was stopped; %s", timeout, uninterruptible, fresh)}
	case killed:
		end.Error = &guest.CodeError{Name: "TimeoutError", Value: fmt.Sprintf(
			"the cell did not stop within %s of its interrupt at its timeout of %s: its interpreter was killed; %s", interruptGrace, timeout, fresh)}
	case why != "":
		end.Error = &guest.CodeError{Name: "ContextDied", Value: fmt.Sprintf("the context was %s while the cell ran", why)}
	case exit.OOM:
		end.Error = &guest.CodeError{Name: "OOMKilled", Value: fmt.Sprintf(
			"the interpreter %s: the cell went over the sandbox's memory limit; %s", exit.How, fresh)}
	default:
		end.Error = &guest.CodeError{Name: "ContextDied", Value: fmt.Sprintf("the interpreter %s; %s", exit.How, fresh)}
	}
}
