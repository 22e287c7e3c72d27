package server

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/kernel"
	"github.com/roche-sandbox/roche/internal/proctree"
)

// Code contexts: each is a kernel (internal/guest/kernel), started as the sandbox user under every
// limit exactly as a command is, that keeps its variables from one cell to the next.
// A context's cells run one at a time.

const (
	languagePython = "python"
	// interruptGrace is how long a cell interrupted at its timeout (SIGINT, a
	// KeyboardInterrupt) has to stop before its interpreter is killed.
	interruptGrace = 3 * time.Second
	// kernelReady bounds a kernel's start: python3 importing the standard library.
	kernelReady = 60 * time.Second
	// syncGrace bounds the wait, after a cell ends, for what its subprocesses wrote to the
	// raw stdout and stderr pipes before that (the kernel's sync marks).
	syncGrace = time.Second
	// maxEventLine caps one kernel event (a result with a large image); a bigger one is
	// dropped with a note on stderr. It fits in one agent frame.
	maxEventLine = 7 << 20
)

// codeContext is one context.
type codeContext struct {
	guest.CodeContext
	env map[string]string // added to the sandbox's environment for the interpreter

	// run is held while a cell runs and while the interpreter is replaced.
	run sync.Mutex
	// mu guards k, for restart and remove, which stop the interpreter while a cell runs.
	mu sync.Mutex
	k  *kernelProc
	// lost: the interpreter died; the next cell starts a fresh one and says Restarted.
	lost    bool
	removed bool
	cells   int
}

func (cx *codeContext) kernel() *kernelProc {
	cx.mu.Lock()
	defer cx.mu.Unlock()
	return cx.k
}

// kernelProc is a running kernel.
type kernelProc struct {
	pid    int
	wait   <-chan syscall.WaitStatus
	cmd    *os.File
	events chan event // closed when the kernel's event pipe closes (it died)
	exited chan struct{}
	marks  chan int // ids of the cells whose sync marks came through fd 1 or fd 2

	mu   sync.Mutex
	cell *cellRun // where raw output goes; nil between cells (then it is dropped)
	// stoppedBy says why the agent stopped the kernel ("restarted", "removed", ...).
	stoppedBy string
}

type event struct {
	kernel.Event
	raw []byte // the line, passed on as a result frame without re-encoding
}

func (k *kernelProc) setCell(r *cellRun) {
	k.mu.Lock()
	k.cell = r
	k.mu.Unlock()
}

func (k *kernelProc) raw(kind byte, p []byte) {
	k.mu.Lock()
	r := k.cell
	k.mu.Unlock()
	if r != nil {
		r.emit(kind, p)
	}
}

// stop kills the kernel and everything it started, noting why.
func (k *kernelProc) stop(why string) {
	k.mu.Lock()
	if k.stoppedBy == "" {
		k.stoppedBy = why
	}
	k.mu.Unlock()
	_ = proctree.KillTree(k.pid)
	_ = syscall.Kill(-k.pid, syscall.SIGKILL)
}

func (k *kernelProc) stopReason() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stoppedBy
}

// cellRun is a running cell's output to its client, cut at the output limit.
type cellRun struct {
	send  func(kind byte, p []byte) error
	limit int64

	mu        sync.Mutex
	written   map[byte]int64
	truncated bool
}

func (r *cellRun) emit(kind byte, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if room := r.limit - r.written[kind]; int64(len(data)) > room {
		data = data[:max(room, 0)]
		r.truncated = true
	}
	if len(data) == 0 {
		return
	}
	r.written[kind] += int64(len(data))
	_ = r.send(kind, data)
}

func (r *cellRun) result(raw []byte) {
	_ = r.send(guest.FrameCodeResult, raw)
}

// codeOp serves the code_* operations.
func (s *Server) codeOp(c *conn, req guest.Request) error {
	if err := checkWorkdir(req.Cwd); err != nil {
		return err
	}
	switch req.Op {
	case guest.OpCodeRun:
		return s.runCode(c, req)
	case guest.OpCodeCreate:
		cx, err := s.newContext(req.Language, req.Cwd, req.Env, false)
		if err != nil {
			return err
		}
		cx.run.Lock()
		err = s.ensureKernel(cx)
		cx.run.Unlock()
		if err != nil {
			s.dropContext(cx)
			return err
		}
		return c.sendJSON(guest.FrameReply, cx.CodeContext)
	case guest.OpCodeList:
		return c.sendJSON(guest.FrameReply, s.listContexts())
	case guest.OpCodeRestart:
		cx, err := s.context(req.Context)
		if err != nil {
			return err
		}
		if k := cx.kernel(); k != nil {
			k.stop("restarted")
		}
		cx.run.Lock()
		defer cx.run.Unlock()
		cx.mu.Lock()
		cx.k, cx.lost = nil, false
		cx.mu.Unlock()
		if err := s.ensureKernel(cx); err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpCodeRemove:
		cx, err := s.context(req.Context)
		if err != nil {
			return err
		}
		s.dropContext(cx)
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpCodeWarm:
		if err := s.warm(req.Language, req.Cwd, req.Env); err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	}
	return invalid("unknown operation %q", req.Op)
}

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

// newContext makes a context (its interpreter starts on its first cell).
func (s *Server) newContext(lang, cwd string, env map[string]string, isDefault bool) (*codeContext, error) {
	lang, err := checkLanguage(lang)
	if err != nil {
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	cx := &codeContext{CodeContext: guest.CodeContext{ID: hex.EncodeToString(b[:]), Language: lang, Cwd: cwd, Default: isDefault}, env: env}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping != "" {
		return nil, &guest.Error{Code: guest.CodeStopping, Message: "the sandbox is stopping: " + s.stopping}
	}
	if s.contexts == nil {
		s.contexts = map[string]*codeContext{}
	}
	s.contexts[cx.ID] = cx
	return cx, nil
}

// defaultContext returns the language's default context, made on first use.
func (s *Server) defaultContext(lang, cwd string, env map[string]string) (*codeContext, error) {
	lang, err := checkLanguage(lang)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	for _, cx := range s.contexts {
		if cx.Default && cx.Language == lang {
			s.mu.Unlock()
			return cx, nil
		}
	}
	s.mu.Unlock()
	s.codeMu.Lock() // one default per language, even when two first calls race
	defer s.codeMu.Unlock()
	s.mu.Lock()
	for _, cx := range s.contexts {
		if cx.Default && cx.Language == lang {
			s.mu.Unlock()
			return cx, nil
		}
	}
	s.mu.Unlock()
	return s.newContext(lang, cwd, env, true)
}

func (s *Server) context(id string) (*codeContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cx, ok := s.contexts[id]
	if !ok {
		return nil, notFound("no code context %q in this sandbox", id)
	}
	return cx, nil
}

func (s *Server) listContexts() []guest.CodeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []guest.CodeContext{}
	for _, cx := range s.contexts {
		out = append(out, cx.CodeContext)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// dropContext stops a context's interpreter and forgets it.
func (s *Server) dropContext(cx *codeContext) {
	s.mu.Lock()
	delete(s.contexts, cx.ID)
	s.mu.Unlock()
	cx.mu.Lock()
	cx.removed = true
	k := cx.k
	cx.mu.Unlock()
	if k != nil {
		k.stop("removed")
	}
}

// spareKernel is an interpreter started before any context wanted it, and what it was
// started with: a context takes it only if it would start its own the same way.
type spareKernel struct {
	k        *kernelProc
	language string
	cwd      string
	env      map[string]string
}

// warm starts the spare interpreter (replacing one there was) and waits until it is ready.
func (s *Server) warm(lang, cwd string, env map[string]string) error {
	lang, err := checkLanguage(lang)
	if err != nil {
		return err
	}
	k, err := s.startKernel(cwd, env)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old, stopping := s.spare, s.stopping
	s.spare = nil
	if stopping == "" {
		s.spare = &spareKernel{k: k, language: lang, cwd: cwd, env: env}
	}
	s.mu.Unlock()
	if old != nil {
		old.k.stop("replaced")
	}
	if stopping != "" {
		k.stop("stopped with the sandbox")
		return &guest.Error{Code: guest.CodeStopping, Message: "the sandbox is stopping: " + stopping}
	}
	return nil
}

// takeSpare hands over the spare interpreter if it runs lang and was started with cwd
// and env, as the caller would start its own; else nil, and the spare stays.
func (s *Server) takeSpare(lang, cwd string, env map[string]string) *kernelProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spare
	if sp == nil || sp.language != lang || sp.cwd != cwd || !maps.Equal(sp.env, env) {
		return nil
	}
	s.spare = nil
	select {
	case <-sp.k.exited: // died waiting (the OOM killer): not worth handing over
		go sp.k.stop("")
		return nil
	default:
		return sp.k
	}
}

// stopContexts kills every context's interpreter, and the spare (the sandbox is stopping).
func (s *Server) stopContexts() {
	s.mu.Lock()
	list := make([]*codeContext, 0, len(s.contexts))
	for _, cx := range s.contexts {
		list = append(list, cx)
	}
	spare := s.spare
	s.spare = nil
	s.mu.Unlock()
	if spare != nil {
		spare.k.stop("stopped with the sandbox")
	}
	for _, cx := range list {
		if k := cx.kernel(); k != nil {
			k.stop("stopped with the sandbox")
		}
	}
}

// ensureKernel starts the context's interpreter if it has none running. cx.run is held.
func (s *Server) ensureKernel(cx *codeContext) error {
	cx.mu.Lock()
	removed, k := cx.removed, cx.k
	cx.mu.Unlock()
	if removed {
		return notFound("code context %s was removed", cx.ID)
	}
	if k != nil {
		select {
		case <-k.exited: // it died between cells: a fresh one, and the next cell says so
			k.stop("")
			cx.mu.Lock()
			cx.k, cx.lost = nil, true
			cx.mu.Unlock()
		default:
			return nil
		}
	}
	k = s.takeSpare(cx.Language, cx.Cwd, cx.env)
	if k == nil {
		var err error
		if k, err = s.startKernel(cx.Cwd, cx.env); err != nil {
			return err
		}
	}
	cx.mu.Lock()
	defer cx.mu.Unlock()
	if cx.removed {
		k.stop("removed")
		return notFound("code context %s was removed", cx.ID)
	}
	cx.k = k
	return nil
}

// startKernel starts a kernel as the sandbox user, in the sandbox's cgroup, as exec
// starts a command, and waits for it to say it is ready.
func (s *Server) startKernel(cwd string, extra map[string]string) (*kernelProc, error) {
	env := mergeEnv(s.baseEnv, extra)
	python, err := lookPath("python3", env)
	if err != nil {
		return nil, &guest.Error{Code: guest.CodeUnsupported, Message: "this sandbox's image has no python3 in its PATH: python code contexts need it"}
	}
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	stdoutR, stdoutW, err1 := pipe()
	stderrR, stderrW, err2 := pipe()
	cmdR, cmdW, err3 := pipe()
	evR, evW, err4 := pipe()
	// The kernel's source is its stdin: it fits in the pipe's buffer, so it is written
	// whole and closed before the kernel starts.
	srcR, srcW, err5 := pipe()
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		closeAll()
		return nil, err
	}
	_, err = srcW.WriteString(kernel.Source)
	srcW.Close()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("passing the python kernel its source: %w", err)
	}
	argv := kernel.Argv(python)
	pid, wait, err := s.reaper.start(func() (int, error) {
		pid, err := syscall.ForkExec(python, argv, &syscall.ProcAttr{
			Dir:   cwd,
			Env:   env,
			Files: []uintptr{srcR.Fd(), stdoutW.Fd(), stderrW.Fd(), cmdR.Fd(), evW.Fd()},
			Sys: &syscall.SysProcAttr{
				Setpgid:     true,
				Credential:  s.reaper.credential(s.uid, s.gid),
				UseCgroupFD: s.cgroupFD > 0,
				CgroupFD:    s.cgroupFD,
			},
		})
		if err == nil {
			s.oomFirst(pid)
		}
		return pid, err
	})
	srcR.Close()
	stdoutW.Close()
	stderrW.Close()
	cmdR.Close()
	evW.Close()
	if err != nil {
		stdoutR.Close()
		stderrR.Close()
		cmdW.Close()
		evR.Close()
		return nil, fmt.Errorf("starting the python kernel: %w", err)
	}
	k := &kernelProc{pid: pid, wait: wait, cmd: cmdW, events: make(chan event, 64), exited: make(chan struct{}), marks: make(chan int, 64)}
	go k.readEvents(evR)
	go k.pumpRaw(stdoutR, guest.FrameStdout)
	go k.pumpRaw(stderrR, guest.FrameStderr)

	// The kernel's own stderr (a Python too old to run it) is what a failed start shows.
	var early []byte
	var earlyMu sync.Mutex
	k.setCell(&cellRun{limit: 4096, written: map[byte]int64{}, send: func(_ byte, p []byte) error {
		earlyMu.Lock()
		early = append(early, p...)
		earlyMu.Unlock()
		return nil
	}})
	defer k.setCell(nil)
	timer := time.NewTimer(kernelReady)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-k.events:
			if !ok {
				ws := k.reap(time.Second)
				earlyMu.Lock()
				msg := string(early)
				earlyMu.Unlock()
				if msg == "" {
					msg = "(no output)"
				}
				return nil, fmt.Errorf("the python kernel %s at start: %s", describeExit(ws), msg)
			}
			if ev.T == kernel.EventReady {
				return k, nil
			}
		case <-timer.C:
			k.stop("did not start")
			return nil, fmt.Errorf("the python kernel did not start within %s", kernelReady)
		}
	}
}

// readEvents reads the kernel's event lines until its pipe closes.
func (k *kernelProc) readEvents(f *os.File) {
	defer close(k.exited)
	defer close(k.events)
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, tooLong, err := readLine(br, maxEventLine)
		if err != nil {
			return
		}
		if tooLong {
			k.raw(guest.FrameStderr, []byte(fmt.Sprintf("roche: a result of more than %d MiB was dropped\n", maxEventLine>>20)))
			continue
		}
		var ev kernel.Event
		if json.Unmarshal(line, &ev) != nil {
			continue
		}
		k.events <- event{ev, line}
	}
}

// readLine reads a line of at most limit bytes; a longer one is read to its end and
// reported as too long.
func readLine(br *bufio.Reader, limit int) (line []byte, tooLong bool, err error) {
	for {
		part, err := br.ReadSlice('\n')
		if len(line)+len(part) > limit {
			tooLong = true
		} else {
			line = append(line, part...)
		}
		switch {
		case err == nil:
			return line, tooLong, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, false, err
		}
	}
}

// pumpRaw passes what is written to the kernel's fd 1 or fd 2 (by subprocesses, C code)
// to the running cell, and the sync marks to marks.
func (k *kernelProc) pumpRaw(f *os.File, kind byte) {
	defer f.Close()
	var m kernel.Marks
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			out, cells := m.Feed(buf[:n])
			if len(out) > 0 {
				k.raw(kind, out)
			}
			for _, id := range cells {
				select {
				case k.marks <- id:
				default:
				}
			}
		}
		if err != nil {
			if rest := m.Flush(); len(rest) > 0 {
				k.raw(kind, rest)
			}
			return
		}
	}
}

// reap waits up to d for the kernel's exit status.
func (k *kernelProc) reap(d time.Duration) *syscall.WaitStatus {
	select {
	case ws := <-k.wait:
		return &ws
	case <-time.After(d):
		return nil
	}
}

// runCode runs one cell and streams its output, results and end to c.
func (s *Server) runCode(c *conn, req guest.Request) error {
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
		return err
	}
	cx.run.Lock()
	defer cx.run.Unlock()
	end := guest.CodeEnd{Context: cx.ID}
	if err := s.ensureKernel(cx); err != nil {
		return err
	}
	cx.mu.Lock()
	end.Restarted = cx.lost
	k := cx.k
	cx.lost = false
	cx.cells++
	id := cx.cells
	cx.mu.Unlock()

	limit := req.OutputLimit
	if limit <= 0 {
		limit = defaultOutputLimit
	}
	run := &cellRun{send: c.send, limit: limit, written: map[byte]int64{}}
	k.setCell(run)
	defer k.setCell(nil)
	before := oomKills()
	// The client going away interrupts the cell, as its timeout does.
	gone := make(chan struct{})
	go func() {
		for {
			if _, _, err := c.read(); err != nil {
				close(gone)
				return
			}
		}
	}()
	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var grace <-chan time.Time
	interrupt := func() {
		if grace == nil {
			_ = syscall.Kill(k.pid, syscall.SIGINT)
			grace = time.After(interruptGrace)
		}
	}
	done, killed := false, false
	if _, err := k.cmd.Write(kernel.Cell{ID: id, Code: req.Code}.Line()); err != nil {
		k.stop("") // it is dying already; the loop below sees its pipe close
	}
loop:
	for {
		select {
		case ev, ok := <-k.events:
			if !ok {
				break loop
			}
			switch ev.T {
			case kernel.EventStdout:
				run.emit(guest.FrameStdout, []byte(ev.S))
			case kernel.EventStderr:
				run.emit(guest.FrameStderr, []byte(ev.S))
			case kernel.EventResult:
				run.result(ev.raw)
			case kernel.EventError:
				end.Error = &guest.CodeError{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
			case kernel.EventDone:
				if ev.ID == id {
					end.ExecutionCount = ev.Count
					done = true
					break loop
				}
			}
		case <-timeout:
			timeout = nil
			end.TimedOut = true
			interrupt()
		case <-gone:
			gone = nil
			interrupt()
		case <-grace:
			grace = nil
			killed = true
			k.stop("")
		}
	}
	if done {
		k.awaitMarks(id)
	} else {
		s.kernelDied(cx, k, &end, killed, before, time.Duration(req.TimeoutMS)*time.Millisecond)
	}
	end.DurationNS = time.Since(start).Nanoseconds()
	run.mu.Lock()
	end.Truncated = run.truncated
	run.mu.Unlock()
	return c.sendJSON(guest.FrameCodeEnd, end)
}

// awaitMarks waits (briefly) for cell id's sync marks on fd 1 and fd 2.
func (k *kernelProc) awaitMarks(id int) {
	timer := time.NewTimer(syncGrace)
	defer timer.Stop()
	for seen := 0; seen < 2; {
		select {
		case got := <-k.marks:
			if got == id {
				seen++
			}
		case <-timer.C:
			return
		}
	}
}

// kernelDied records, in end, how the kernel died in the middle of a cell; the
// context's next cell starts a fresh one.
func (s *Server) kernelDied(cx *codeContext, k *kernelProc, end *guest.CodeEnd, killed bool, oomBefore int64, timeout time.Duration) {
	k.stop("") // its subprocesses go with it
	ws := k.reap(5 * time.Second)
	cx.mu.Lock()
	if cx.k == k {
		cx.k = nil
		cx.lost = true
	}
	cx.mu.Unlock()
	end.Died = true
	why := k.stopReason()
	switch {
	case killed:
		end.Error = &guest.CodeError{Name: "TimeoutError", Value: fmt.Sprintf(
			"the cell did not stop within %s of its interrupt at its timeout of %s: its interpreter was killed; the next call starts a fresh context", interruptGrace, timeout)}
	case why != "":
		end.Error = &guest.CodeError{Name: "ContextDied", Value: fmt.Sprintf("the context was %s while the cell ran", why)}
	case ws != nil && ws.Signaled() && ws.Signal() == syscall.SIGKILL && oomBefore >= 0 && oomKills() > oomBefore:
		end.Error = &guest.CodeError{Name: "OOMKilled", Value: "the interpreter was killed by the out-of-memory killer: the cell went over the sandbox's memory limit; the next call starts a fresh context"}
	default:
		end.Error = &guest.CodeError{Name: "ContextDied", Value: fmt.Sprintf("the interpreter %s; the next call starts a fresh context", describeExit(ws))}
	}
}

func describeExit(ws *syscall.WaitStatus) string {
	switch {
	case ws == nil:
		return "stopped answering"
	case ws.Signaled():
		return fmt.Sprintf("was killed by signal %d (%s)", int(ws.Signal()), ws.Signal())
	default:
		return fmt.Sprintf("exited with status %d", ws.ExitStatus())
	}
}
