package server

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/proctree"
	"golang.org/x/sys/unix"
)

const (
	defaultOutputLimit = 10 << 20
	// drainGrace is how long output is still read after a command exits: a descendant it
	// left running may hold the pipes open, and the exec must not wait for that.
	drainGrace = 250 * time.Millisecond
	// keepFinished bounds how many finished background processes are kept for attach.
	keepFinished = 64
	// startedDelay is how long a foreground command's started frame may wait to go out
	// with its first output or its result, in one write: a command that ends sooner
	// (most do) then costs its client one wake-up and the agent one write fewer.
	startedDelay = 10 * time.Millisecond
)

// reaper is PID 1's wait loop: it reaps every child, delivering the status of the
// commands the agent started to their waiters and discarding orphans that were
// reparented to it. Commands are started under the same lock, so a command cannot be
// reaped before its waiter is registered.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan exitStatus
	// forks takes each fork to the thread that runs them (forkThread); forkErr is why
	// that thread could not empty its bounding set, nil when it did.
	forks   chan func()
	forkErr error
	// asUser is set when the forking thread runs as the sandbox user (forkAs), with its
	// uid and gid.
	asUser       bool
	asUID, asGID int
}

// processReaper is the one reaper of this process, started on first use: a wait for any
// child reaps every server's, so two servers in one process (the tests run several) must
// share it, or one would take the other's exit statuses.
var processReaper = sync.OnceValue(func() *reaper {
	// A kernel forked from another is orphaned to its reaper (reaper.adopt): this
	// process, PID 1 in a sandbox, and a subreaper where it is not (tests).
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	r := &reaper{waiters: map[int]chan exitStatus{}, forks: make(chan func())}
	dropped := make(chan error, 1)
	go r.forkThread(dropped)
	r.forkErr = <-dropped
	go r.run()
	return r
})

// forkThread runs every fork of the process (reaper.start) on one OS thread of its own,
// whose capability bounding set it first empties: capability sets belong to threads, a
// child starts with its forking thread's, and the agent's other threads never fork, so
// no command can gain a capability through execve. Emptying one thread's set takes a
// system call per capability; emptying every thread's (syscall.AllThreadsSyscall, which
// stops them all for each) cost the agent ~0.9 ms of CPU at every sandbox's start. The
// thread is the forker's for good: its goroutine never unlocks it. What went wrong
// emptying the set is sent on dropped, and then no fork runs.
//
// It is never the main thread, whose id is the process's: /proc/PID/status shows that
// thread's credentials, and a signal to the process is checked against them, so the
// agent's face must stay root's while the forking thread drops its capabilities and, on
// gVisor, becomes the sandbox user (forkAs). A goroutine that finds itself locked to the
// main thread holds it until a new one has locked a thread of its own, which then cannot
// be that one.
func (r *reaper) forkThread(dropped chan<- error) {
	runtime.LockOSThread()
	if syscall.Gettid() == syscall.Getpid() {
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			r.forkLoop(dropped)
		}()
		<-locked
		runtime.UnlockOSThread()
		return
	}
	r.forkLoop(dropped)
}

// forkLoop is forkThread's body, on the thread locked for it.
func (r *reaper) forkLoop(dropped chan<- error) {
	err := dropBoundingSet()
	dropped <- err
	if err != nil {
		return // the thread ends with its goroutine, which holds it
	}
	for fork := range r.forks {
		fork()
	}
}

func (r *reaper) run() {
	ch := make(chan os.Signal, 128)
	signal.Notify(ch, syscall.SIGCHLD)
	r.reap()
	for range ch {
		r.reap()
	}
}

func (r *reaper) reap() {
	for {
		var ws syscall.WaitStatus
		var ru syscall.Rusage
		r.mu.Lock()
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, &ru)
		if pid > 0 {
			if c, ok := r.waiters[pid]; ok {
				c <- exitStatus{WaitStatus: ws, usage: ru}
				delete(r.waiters, pid)
			}
		}
		r.mu.Unlock()
		if pid <= 0 || err != nil {
			return
		}
	}
}

// forkAs makes the forking thread, and only it, run as uid and gid with no
// supplementary groups, for good: every command is then created as the sandbox user
// (see Config.ForkAsUser). System calls made directly, not the syscall package's, which
// change every thread of the process.
func (r *reaper) forkAs(uid, gid int) error {
	if r.forkErr != nil {
		return fmt.Errorf("no fork without an empty capability bounding set: %w", r.forkErr)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.asUser {
		if r.asUID == uid && r.asGID == gid {
			return nil
		}
		return fmt.Errorf("commands are already forked as uid %d, not %d", r.asUID, uid)
	}
	done := make(chan error)
	r.forks <- func() {
		var err error
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			err = fmt.Errorf("dropping the forking thread's groups: %w", e)
		} else if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			err = fmt.Errorf("the forking thread's gid: %w", e)
		} else if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			err = fmt.Errorf("the forking thread's uid: %w", e)
		}
		done <- err
	}
	if err := <-done; err != nil {
		return fmt.Errorf("forking commands as the sandbox user: %w", err)
	}
	r.asUser, r.asUID, r.asGID = true, uid, gid
	return nil
}

// credential is what a command starts as: uid and gid with no supplementary groups,
// which a forking thread that already runs as them (forkAs) need not, and could not, set.
func (r *reaper) credential(uid, gid int) *syscall.Credential {
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}, NoSetGroups: r.asUser}
}

// exitStatus is how a command the agent started ended, with the rusage of its process
// tree: the command's own and that of every descendant it waited for (wait4's).
type exitStatus struct {
	syscall.WaitStatus
	usage syscall.Rusage
}

// receipt is what a command used, from its rusage and the processes left in its tree
// and process group once it exited.
func receipt(es exitStatus, leftover int) *guest.Receipt {
	cpu := time.Duration(es.usage.Utime.Nano() + es.usage.Stime.Nano())
	return &guest.Receipt{PeakMemoryBytes: es.usage.Maxrss * 1024, CPUTimeNS: cpu.Nanoseconds(), Leftover: leftover}
}

// adopt registers the waiter of pid, a process this agent did not fork but that is (or
// will be, once its parent exits) its child: a kernel forked from another (the agent
// is PID 1, or a subreaper). One already reaped gets a status at once; a pid the reaper
// already waits for is refused.
func (r *reaper) adopt(pid int) (<-chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.waiters[pid]; ok || pid <= 1 {
		return nil, fmt.Errorf("process %d is not a new one", pid)
	}
	c := make(chan exitStatus, 1)
	// Under r.mu no wait4 runs: a process alive now is reaped later, with c waiting.
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		c <- exitStatus{WaitStatus: syscall.WaitStatus(syscall.SIGKILL)}
		return c, nil
	}
	r.waiters[pid] = c
	return c, nil
}

// start runs fork under the reaper's lock and registers the new pid's waiter.
func (r *reaper) start(fork func() (int, error)) (int, <-chan exitStatus, error) {
	if r.forkErr != nil {
		return 0, nil, fmt.Errorf("no fork without an empty capability bounding set: %w", r.forkErr)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var pid int
	var err error
	done := make(chan struct{})
	r.forks <- func() {
		defer close(done)
		pid, err = fork()
	}
	<-done
	if err != nil {
		return 0, nil, err
	}
	c := make(chan exitStatus, 1)
	r.waiters[pid] = c
	return pid, c, nil
}

// proc is a command the agent started.
type proc struct {
	pid   int
	cmd   []string
	tag   string
	env   map[string]string // as the request gave it, for the listing
	cwd   string
	key   string // the idempotency key it was started with
	ttyOn bool
	// durable: the command belongs to the sandbox, not to the connection that started it
	// (a background command, a terminal session, a keyed exec). Its output goes to log,
	// which its clients follow by offsets; a non-durable command's goes to sink alone.
	durable bool
	// cut is the output limit per stream past which output is dropped and the result
	// flagged truncated; 0 for none (a background command's window slides instead).
	cut     int64
	started time.Time
	done    chan struct{}
	budget  *keptBudget
	// trace is the request's spans to record (trace_linux.go); nil: none asked.
	trace *reqTrace

	// tty is the master of the command's terminal (nil without one), set before the
	// command is listed and never changed; ttyClosed says it was closed. ttyMu orders
	// writes only: closing needs no lock (a Close wakes a pending Write), so a write
	// blocked on a program that reads no input holds up neither its output nor its end.
	tty       *os.File
	ttyClosed atomic.Bool
	ttyMu     sync.Mutex
	// inputEnded says the terminal's input has ended (endInput).
	inputEnded atomic.Bool
	// stdin is a durable command's open stdin (started with Stdin), until closed;
	// stdinMu orders writes and the close.
	stdinMu sync.Mutex
	stdin   *os.File

	mu   sync.Mutex
	sink *conn // where a non-durable command's output goes; nil once its client is gone
	// pending is the started frame not yet sent (see startedDelay), and startedTimer
	// sends it when the command outlives the delay.
	pending      []byte
	startedTimer *time.Timer
	// log keeps a durable command's output; changed is closed (and replaced) when it
	// grows or the command ends, if watched says a follower waits on it.
	log       *outputLog
	changed   chan struct{}
	watched   bool
	written   map[byte]int64
	truncated bool
	timedOut  bool
	result    guest.Result
	// stopping, once finished, says why the exit status is not the command's own: the
	// sandbox stopped under it.
	stopping string
	ended    time.Time
	// finished is set with result, under mu but before the result goes to any client,
	// and read without mu too (which a write to a slow client can hold).
	finished atomic.Bool
}

// emit passes output to the attached client of a non-durable command, or keeps it in a
// durable command's log for its followers, cutting each stream at the output limit.
func (p *proc) emit(kind byte, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut > 0 {
		if room := p.cut - p.written[kind]; int64(len(data)) > room {
			data = data[:max(room, 0)]
			p.truncated = true
		}
	}
	if len(data) == 0 {
		return
	}
	p.written[kind] += int64(len(data))
	if p.log != nil {
		p.budget.add(p.log.append(streamIndex(kind), data))
		p.wake()
		return
	}
	if p.sink != nil {
		if err := p.sink.sendAfter(p.takeStarted(), kind, data); err != nil {
			p.sink = nil
		}
	}
}

// wake tells a durable command's waiting followers that it changed. p.mu is held.
func (p *proc) wake() {
	if p.watched {
		close(p.changed)
		p.changed = make(chan struct{})
		p.watched = false
	}
}

// announce tells the client of a non-durable command that it runs: at once on a
// terminal, whose client waits for it; otherwise with its first output or its result,
// or after startedDelay, whichever comes first.
func (p *proc) announce(c *conn) error {
	b, err := json.Marshal(guest.Started{PID: p.pid})
	if err != nil {
		return err
	}
	if p.ttyOn {
		return c.send(guest.FrameStarted, b)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished.Load() {
		return nil
	}
	p.pending = b
	p.startedTimer = time.AfterFunc(startedDelay, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if started := p.takeStarted(); started != nil && p.sink != nil {
			if err := p.sink.send(guest.FrameStarted, started); err != nil {
				p.sink = nil
			}
		}
	})
	return nil
}

// takeStarted returns the started frame still to send, if any, and forgets it. p.mu is held.
func (p *proc) takeStarted() []byte {
	b := p.pending
	p.pending = nil
	if p.startedTimer != nil {
		p.startedTimer.Stop()
		p.startedTimer = nil
	}
	return b
}

// isTTY says whether the command runs on a terminal (set before it starts, never changed).
func (p *proc) isTTY() bool { return p.ttyOn }

// typeInto writes what a user typed to the command's terminal.
func (p *proc) typeInto(data []byte) error {
	p.ttyMu.Lock()
	defer p.ttyMu.Unlock()
	if p.tty == nil || p.ttyClosed.Load() {
		return notFound("process %d has no terminal open", p.pid)
	}
	_, err := p.tty.Write(data)
	return err
}

func (p *proc) resize(ws guest.Winsize) error {
	if p.tty == nil || p.ttyClosed.Load() {
		return notFound("process %d has no terminal open", p.pid)
	}
	return setWinsize(p.tty, ws.Cols, ws.Rows)
}

func (p *proc) closeTTY() {
	if p.tty != nil && !p.ttyClosed.Swap(true) {
		p.tty.Close()
	}
}

// kill kills the command, its descendants and its process group.
func (p *proc) kill() {
	_ = proctree.KillTree(p.pid)
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
}

// finish records the command's result and sends it to the attached client (a durable
// command's followers read it from the proc). When the sandbox is stopping (stopping is
// why), the client hears that instead: the exit status of a command killed with its
// sandbox says nothing of the command.
func (p *proc) finish(res guest.Result, stopping string) {
	p.mu.Lock()
	res.Truncated = p.truncated
	res.TimedOut = p.timedOut
	res.Spans = p.spans(res)
	p.result = res
	p.stopping = stopping
	p.ended = time.Now()
	p.finished.Store(true)
	started := p.takeStarted()
	if p.sink != nil {
		kind, v := byte(guest.FrameResult), any(res)
		if stopping != "" {
			kind, v = guest.FrameError, stoppedWith(stopping, res)
		}
		if b, err := json.Marshal(v); err == nil {
			_ = p.sink.sendAfter(started, kind, b)
		}
	}
	if p.log != nil {
		p.wake()
	}
	p.mu.Unlock()
	p.closeStdin()
	close(p.done)
}

// stoppedWith is what a client hears of a command the sandbox's stop ended.
func stoppedWith(stopping string, res guest.Result) *guest.Error {
	return &guest.Error{Code: guest.CodeStopping,
		Message: fmt.Sprintf("the sandbox is stopping: %s; the command was stopped with it (exit %d)", stopping, res.ExitCode)}
}

func (s *Server) exec(c *conn, req guest.Request) error {
	if req.TTY && len(req.Cmd) == 0 {
		req.Cmd = []string{imageShell()}
	}
	if len(req.Cmd) == 0 {
		return invalid("empty command: give the program and its arguments")
	}
	if err := checkDurable(req); err != nil {
		return err
	}
	if err := checkWorkdir(req.Cwd); err != nil {
		return err
	}
	// A keyed start holds keyMu until its command is listed, so that a retry racing it
	// joins it rather than starting another.
	release := func() {}
	if req.Key != "" {
		s.keyMu.Lock()
		release = sync.OnceFunc(s.keyMu.Unlock)
		defer release()
		if p, err := s.keyed(req.Key); p != nil || err != nil {
			release()
			if err != nil {
				return err
			}
			return s.join(c, p, req)
		}
	}
	durable := req.Background || req.Key != ""
	bound := guest.MaxDurable
	if req.MaxDurable > 0 {
		bound = min(bound, req.MaxDurable)
	}
	if durable && s.runningDurable() >= bound {
		return &guest.Error{Code: guest.CodeExhausted, Message: fmt.Sprintf(
			"%d commands are running in the background in this sandbox, the most allowed at once: wait for one to end, or kill one", bound)}
	}
	env := mergeEnv(s.baseEnv, req.Env)
	p := &proc{
		cmd: req.Cmd, tag: req.Tag, env: req.Env, cwd: req.Cwd, key: req.Key, ttyOn: req.TTY, durable: durable,
		done: make(chan struct{}), written: map[byte]int64{}, budget: s.kept, trace: newReqTrace(req),
	}
	limit := req.OutputLimit
	if limit <= 0 {
		limit = defaultOutputLimit
	}
	switch {
	case req.TTY:
		// A terminal runs for as long as its user likes: its output is not cut at the
		// limit, but only the last limit's worth is kept for the next attach.
		if durable {
			p.log = newOutputLog(cmp.Or(req.Window, limit))
		}
	case req.Background:
		p.log = newOutputLog(cmp.Or(req.Window, guest.DefaultWindow))
	case durable:
		// A keyed exec keeps everything it sends, so that a retry replays all of it.
		p.cut = limit
		p.log = newOutputLog(limit)
	default:
		p.cut = limit
	}
	if p.log != nil {
		p.changed = make(chan struct{})
	} else {
		p.sink = c
	}

	path, err := lookPath(req.Cmd[0], env)
	if err != nil {
		return s.startFailed(c, p, err)
	}
	if req.TTY {
		return s.execTTY(c, p, req, path, env, release)
	}
	stdoutR, stdoutW, err := outputPipe()
	if err != nil {
		return err
	}
	stderrR, stderrW, err := outputPipe()
	if err != nil {
		stdoutR.Close()
		syscall.Close(stdoutW)
		return err
	}
	var stdinR int
	var stdinW *os.File
	if req.Stdin {
		stdinR, stdinW, err = inputPipe()
	} else {
		stdinR, err = devNull()
	}
	if err != nil {
		stdoutR.Close()
		syscall.Close(stdoutW)
		stderrR.Close()
		syscall.Close(stderrW)
		return err
	}
	start := time.Now()
	before := countsNow()
	pid, wait, err := s.reaper.start(func() (int, error) {
		pid, err := syscall.ForkExec(path, req.Cmd, &syscall.ProcAttr{
			Dir:   req.Cwd,
			Env:   env,
			Files: []uintptr{uintptr(stdinR), uintptr(stdoutW), uintptr(stderrW)},
			Sys: &syscall.SysProcAttr{
				// Its own process group, so signals and kills reach everything it starts.
				Setpgid:    true,
				Credential: s.reaper.credential(s.uid, s.gid),
				// Born inside the sandbox's cgroup (clone3), so no fork can escape its limits.
				UseCgroupFD: s.cgroupFD > 0,
				CgroupFD:    s.cgroupFD,
			},
		})
		if err == nil {
			s.oomFirst(pid)
		}
		return pid, err
	})
	if req.Stdin {
		syscall.Close(stdinR)
	}
	syscall.Close(stdoutW)
	syscall.Close(stderrW)
	if err != nil {
		stdoutR.Close()
		stderrR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		return s.startFailed(c, p, err)
	}
	p.pid, p.started = pid, start
	if durable {
		p.stdin = stdinW
	}
	s.register(p)
	release()

	pumps := newPumps(2)
	go p.pump(stdoutR, guest.FrameStdout, pumps)
	go p.pump(stderrR, guest.FrameStderr, pumps)
	cut := func() {
		stdoutR.Close()
		stderrR.Close()
	}
	if durable {
		go s.await(p, req, start, before, wait, pumps, cut)
		return s.started(c, p, req)
	}
	if err := p.announce(c); err != nil {
		p.kill()
	}
	go s.readClient(c, p, stdinW)
	s.await(p, req, start, before, wait, pumps, cut)
	return nil
}

// checkDurable checks what only durable commands take.
func checkDurable(req guest.Request) error {
	switch {
	case len(req.Tag) > guest.MaxTag:
		return invalid("a tag of %d bytes is over the limit of %d", len(req.Tag), guest.MaxTag)
	case len(req.Key) > guest.MaxKey:
		return invalid("an idempotency key of %d bytes is over the limit of %d", len(req.Key), guest.MaxKey)
	case req.Window < 0 || req.Window > guest.MaxWindow:
		return invalid("a window of %d bytes per stream is outside 0 (the default, %s) to %s", req.Window, mib(guest.DefaultWindow), mib(guest.MaxWindow))
	case req.Key != "" && req.TTY:
		return invalid("an idempotency key is for commands without a terminal")
	case (req.Tag != "" || req.Window != 0) && !req.Background && req.Key == "":
		return invalid("a tag and a window are for commands started in the background")
	}
	return nil
}

// started answers the request that started a durable command: a background start with
// its started frame at once (the command goes on without the connection), a keyed exec
// by following the command's output from the start to its end.
func (s *Server) started(c *conn, p *proc, req guest.Request) error {
	if req.Background {
		return c.sendJSON(guest.FrameStarted, guest.Started{PID: p.pid, Tag: p.tag})
	}
	return s.follow(c, p, &guest.Offsets{}, false)
}

// join answers a request whose idempotency key names a command already started.
func (s *Server) join(c *conn, p *proc, req guest.Request) error {
	if req.Background {
		return c.sendJSON(guest.FrameStarted, guest.Started{PID: p.pid, Tag: p.tag, Existing: true})
	}
	return s.follow(c, p, &guest.Offsets{}, true)
}

// pumpGroup counts the goroutines copying a command's output; done is closed when the
// last one ends.
type pumpGroup struct {
	left atomic.Int32
	done chan struct{}
}

func newPumps(n int32) *pumpGroup {
	ps := &pumpGroup{done: make(chan struct{})}
	ps.left.Store(n)
	return ps
}

func (ps *pumpGroup) finished() {
	if ps.left.Add(-1) == 0 {
		close(ps.done)
	}
}

// execTTY runs a command on a new terminal: the terminal is its standard streams and
// its controlling terminal, it leads a session of its own, and the terminal's output
// is its one output stream.
func (s *Server) execTTY(c *conn, p *proc, req guest.Request, path string, env []string, release func()) error {
	master, slave, err := s.openPTY(req.Cols, req.Rows)
	if err != nil {
		return err
	}
	if !hasEnv(env, "TERM") {
		env = append(env, "TERM=xterm-256color")
	}
	start := time.Now()
	before := countsNow()
	pid, wait, err := s.reaper.start(func() (int, error) {
		pid, err := syscall.ForkExec(path, req.Cmd, &syscall.ProcAttr{
			Dir:   req.Cwd,
			Env:   env,
			Files: []uintptr{slave.Fd(), slave.Fd(), slave.Fd()},
			Sys: &syscall.SysProcAttr{
				// A session of its own with the terminal as its controlling terminal (fd 0
				// in the child): the terminal's line discipline then signals its
				// foreground job on Ctrl-C, and a kill of -pid reaches the whole session.
				Setsid:      true,
				Setctty:     true,
				Ctty:        0,
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
	slave.Close()
	if err != nil {
		master.Close()
		return s.startFailed(c, p, err)
	}
	p.pid, p.started = pid, start
	p.tty = master
	s.register(p)
	release()
	pumps := newPumps(1)
	go func() {
		defer pumps.finished()
		buf := make([]byte, 32<<10)
		for {
			n, err := master.Read(buf)
			if n > 0 {
				p.emit(guest.FrameStdout, buf[:n])
			}
			if err != nil { // EIO once every holder of the terminal has gone
				return
			}
		}
	}()
	if p.durable {
		go func() {
			s.await(p, req, start, before, wait, pumps, p.closeTTY)
			p.closeTTY()
		}()
		return s.started(c, p, req)
	}
	if err := p.announce(c); err != nil {
		p.kill()
	}
	go s.readClient(c, p, nil)
	s.await(p, req, start, before, wait, pumps, p.closeTTY)
	p.closeTTY()
	return nil
}

// imageShell is the shell a terminal runs when the caller names none: bash where the
// image has it, else the POSIX sh every image has.
func imageShell() string {
	if fi, err := os.Stat("/bin/bash"); err == nil && fi.Mode()&0o111 != 0 {
		return "/bin/bash"
	}
	return "/bin/sh"
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// await waits for the command (killing it at its timeout), drains its output for at
// most drainGrace (then cut, which ends the pumps), and sends its result.
func (s *Server) await(p *proc, req guest.Request, start time.Time, before counts, wait <-chan exitStatus, pumps *pumpGroup, cut func()) {
	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var ws exitStatus
	// limit is the sandbox's process limit as the command ended with an error or was
	// killed, counted before its leftovers can go (processLimit).
	var limit procLimit
	select {
	case ws = <-wait:
		if ws.Signaled() || ws.ExitStatus() != 0 {
			limit = s.processLimit(true)
		}
	case <-timeout:
		p.mu.Lock()
		p.timedOut = true
		p.mu.Unlock()
		// Stopped first (as KillTree does anyway): a fork bomb's processes, spinning on
		// a failing fork, would otherwise hold the CPU the count needs. Stopped, they
		// still count against the limit.
		_ = syscall.Kill(-p.pid, syscall.SIGSTOP)
		limit = s.processLimit(false)
		p.kill()
		ws = <-wait
	}
	duration := time.Since(start)
	select {
	case <-pumps.done: // most often the output has ended with the command
	default:
		grace := time.NewTimer(drainGrace)
		select {
		case <-pumps.done:
		case <-grace.C:
			cut()
			<-pumps.done
		}
		grace.Stop()
	}
	pid := p.pid

	res := guest.Result{PID: pid, ExitCode: ws.ExitStatus(), DurationNS: duration.Nanoseconds(),
		Receipt: receipt(ws, proctree.Leftover(pid))}
	if ws.Signaled() {
		res.ExitCode = 128 + int(ws.Signal())
		res.Signal = int(ws.Signal())
	}
	// Killed by the OOM killer: the command died of SIGKILL, or exited 137 as a shell
	// does whose child died of it (sh -c 'head -c 100M /dev/zero > /dev/shm/f'), and the
	// cgroup counted an OOM kill meanwhile. Memory held by a tmpfs (/dev/shm, /tmp)
	// belongs to no process, so the victim need not be the program that filled it.
	p.mu.Lock()
	timedOut, truncated := p.timedOut, p.truncated
	p.mu.Unlock()
	res.Receipt.End, res.Receipt.Evidence = endOf(res, timedOut, truncated, before, limit,
		time.Duration(req.TimeoutMS)*time.Millisecond, p.cut)
	res.OOMKilled = res.Receipt.End == "oom"
	p.finish(res, s.stopReason())
	s.retire(p)
}

// startFailed reports a command that could not start the way a shell does: a message on
// stderr and exit status 127 (not found) or 126 (not executable).
func (s *Server) startFailed(c *conn, p *proc, err error) error {
	code := 126
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, errNotInPath) {
		code = 127
	}
	msg := fmt.Sprintf("roche-agent: %s: %v\n", p.cmd[0], err)
	if errors.Is(err, errNotInPath) {
		msg = fmt.Sprintf("roche-agent: %s: command not found\n", p.cmd[0])
	}
	if err := c.send(guest.FrameStderr, []byte(msg)); err != nil {
		return err
	}
	return c.sendJSON(guest.FrameResult, guest.Result{ExitCode: code})
}

// retire forgets a finished non-durable command; finished durable commands are kept
// (a bounded number) so a client can still attach and read their result.
func (s *Server) retire(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !p.durable {
		if s.procs[p.pid] == p {
			delete(s.procs, p.pid)
		}
		return
	}
	var finished []*proc
	for _, q := range s.procs {
		if q.durable && isFinished(q) {
			finished = append(finished, q)
		}
	}
	if len(finished) > keepFinished {
		sort.Slice(finished, func(i, j int) bool { return finished[i].endedAt().Before(finished[j].endedAt()) })
		for _, q := range finished[:len(finished)-keepFinished] {
			delete(s.procs, q.pid)
			q.dropOutput()
		}
	}
}

// isFinished reports whether the command's result is recorded. That is before any
// client hears the result, and before p.done closes: a client that saw a command end
// and then types into it must find it finished.
func isFinished(p *proc) bool { return p.finished.Load() }

// pumpBuffers are the pumps' read buffers, kept between commands: two fresh 32 KiB
// buffers per exec were most of what an exec allocated, and made the agent collect
// garbage every couple of dozen execs.
var pumpBuffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (p *proc) pump(r *os.File, kind byte, ps *pumpGroup) {
	defer ps.finished()
	defer r.Close()
	bp := pumpBuffers.Get().(*[32 << 10]byte)
	defer pumpBuffers.Put(bp)
	buf := bp[:]
	for {
		n, err := r.Read(buf)
		if n > 0 {
			p.emit(kind, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// readClient handles what the client of a non-durable command sends while it runs:
// stdin, signals, and its going away, which kills the command.
func (s *Server) readClient(c *conn, p *proc, stdin *os.File) {
	defer func() {
		if stdin != nil {
			stdin.Close()
		}
	}()
	for {
		kind, payload, err := c.read()
		if err != nil {
			p.mu.Lock()
			if p.sink == c {
				p.sink = nil
			}
			p.mu.Unlock()
			if !isFinished(p) {
				p.kill()
			}
			return
		}
		switch kind {
		case guest.FrameStdin:
			if p.isTTY() {
				_ = p.typeInto(payload)
			} else if stdin != nil {
				if _, err := stdin.Write(payload); err != nil {
					stdin.Close()
					stdin = nil
				}
			}
		case guest.FrameStdinEOF:
			if p.isTTY() {
				p.endInput()
			}
			if stdin != nil {
				stdin.Close()
				stdin = nil
			}
		default:
			p.control(kind, payload)
		}
	}
}

// control handles a resize or a signal frame from a client of the command.
func (p *proc) control(kind byte, payload []byte) {
	switch kind {
	case guest.FrameResize:
		var ws guest.Winsize
		if p.isTTY() && jsonUnmarshal(payload, &ws) == nil {
			_ = p.resize(ws)
		}
	case guest.FrameSignal:
		var sr guest.SignalRequest
		if err := jsonUnmarshal(payload, &sr); err == nil && sr.Signal > 0 && sr.Signal <= 64 {
			_ = syscall.Kill(-p.pid, syscall.Signal(sr.Signal))
		}
	}
}

// outputPipe makes a pipe for a command's output: the read end is the agent's, polled
// by the runtime; the write end, a bare descriptor, is only handed to the command and
// closed. (os.Pipe would register both ends with the poller and take the write end out
// again for the command, six system calls an exec does not need.)
func outputPipe() (r *os.File, w int, err error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, -1, fmt.Errorf("making an output pipe: %w", err)
	}
	r, err = pollable(p[0], "|0")
	if err != nil {
		syscall.Close(p[1])
		return nil, -1, err
	}
	return r, p[1], nil
}

// inputPipe makes a pipe for a command's stdin: the read end is the command's, the
// write end the agent's, polled by the runtime.
func inputPipe() (r int, w *os.File, err error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return -1, nil, fmt.Errorf("making an input pipe: %w", err)
	}
	w, err = pollable(p[1], "|1")
	if err != nil {
		syscall.Close(p[0])
		return -1, nil, err
	}
	return p[0], w, nil
}

// pollable makes fd non-blocking, so that os.NewFile hands it to the runtime's poller
// and a read or write waiting on it holds no thread. The other end of the pipe, the
// command's, stays blocking, as programs expect of their standard streams.
func pollable(fd int, name string) (*os.File, error) {
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("making a pipe non-blocking: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// devNull is the stdin of every command that reads none: one descriptor of /dev/null,
// opened on first use (a microVM's agent mounts /dev before it serves) and shared, as
// every command gets a duplicate of it. A failure to open it is not kept: the next exec
// tries again, as each did when it opened its own.
func devNull() (int, error) {
	devNullFD.mu.Lock()
	defer devNullFD.mu.Unlock()
	if devNullFD.open {
		return devNullFD.fd, nil
	}
	fd, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s for a command's stdin: %w", os.DevNull, err)
	}
	devNullFD.fd, devNullFD.open = fd, true
	return fd, nil
}

var devNullFD struct {
	mu   sync.Mutex
	open bool
	fd   int
}

// oomFirst makes a command the OOM killer's first choice over the agent (the highest
// oom_score_adj; raising it needs no privilege). Memory a program leaves in a tmpfs is
// nobody's RSS, so without it a small program filling /dev/shm could get the agent, a
// bigger process, killed, and the sandbox with it. Children inherit the score. A program
// may lower its own back to the agent's, and then risk only its own sandbox. The score
// is raised once the command has started (Go runs nothing of ours between fork and
// exec), so for its first moments it has the agent's, and so has whatever it starts
// in them: a shell forks its program at once, and on a loaded host this goroutine may
// run milliseconds after the exec. Those are raised too, found by the command's process
// group (and tree) after its own score is raised, as what it starts later inherits it:
// else a program under `sh -c` taking memory kept the agent's score, and the agent,
// then as likely a victim, was killed in its place under load (the oci conformance
// suite's OOMThroughTmpfs, "sandbox is gone").
func (s *Server) oomFirst(pid int) {
	if f := beforeOOMFirst.Load(); f != nil {
		(*f)(pid)
	}
	if err := raiseOOMScore(pid); err != nil {
		s.log.Warn("raising a command's OOM score", "pid", pid, "err", err)
		return
	}
	proctree.EachMember(pid, func(p int) {
		if err := raiseOOMScore(p); err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ESRCH) {
			s.log.Warn("raising the OOM score of what a command started", "pid", p, "err", err)
		}
	})
}

// beforeOOMFirst, when set (tests), runs before a command's OOM score is raised.
var beforeOOMFirst atomic.Pointer[func(pid int)]

// raiseOOMScore makes process pid the OOM killer's first choice.
func raiseOOMScore(pid int) error {
	// Bare system calls: os.WriteFile would also try to register the file with the
	// runtime's poller, four more system calls on every exec's path.
	fd, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, err = syscall.Write(fd, []byte("1000"))
	syscall.Close(fd)
	return err
}

// oomCounter is the sandbox cgroup's OOM-kill counter (cgroup v1, v2, and a microVM's
// sandbox cgroup).
var oomCounter = &cgroupCounter{key: "oom_kill ",
	files: []string{"/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events", vmCgroup + "/memory.events"}}

// cgroupCounter is one line of a cgroup events file. It holds the file open once found:
// every exec reads it, and a pread at offset 0 makes the kernel render the file afresh
// in one system call, where opening, reading and closing it took eight.
type cgroupCounter struct {
	key   string
	files []string
	mu    sync.Mutex
	found bool
	fd    int
}

// oomKills reads the sandbox cgroup's OOM-kill counter (cgroup v1 or v2); -1 if unknown.
func oomKills() int64 { return oomCounter.read() }

// read returns the counter, -1 if no file has it.
func (c *cgroupCounter) read() int64 {
	c.mu.Lock()
	found, fd := c.found, c.fd
	c.mu.Unlock()
	if found {
		if n, ok := readCounter(fd, c.key); ok {
			return n
		}
	}
	for _, f := range c.files {
		fd, err := syscall.Open(f, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		n, ok := readCounter(fd, c.key)
		if !ok {
			syscall.Close(fd)
			continue
		}
		c.mu.Lock()
		if !c.found {
			c.found, c.fd, fd = true, fd, -1
		}
		c.mu.Unlock()
		if fd >= 0 { // another exec kept its descriptor first
			syscall.Close(fd)
		}
		return n
	}
	return -1
}

// readCounter reads the line starting with key of the events file open at fd.
func readCounter(fd int, key string) (int64, bool) {
	var buf [1024]byte
	n, err := syscall.Pread(fd, buf[:], 0)
	if err != nil || n <= 0 {
		return 0, false
	}
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// counts are the sandbox cgroup's counters when a command started.
type counts struct{ oom int64 }

func countsNow() counts { return counts{oom: oomKills()} }

// endOf says why a command ended or was cut when something other than the command did
// it, with the evidence (roche.EndKind values; empty when it ended on its own): its
// timeout (with the process limit in the evidence when the sandbox was at it: a fork
// bomb held there until its timeout ended by the timeout), the OOM killer (it died of
// SIGKILL, or exited 137 as a shell does whose child died of it, and the cgroup counted
// an OOM kill meanwhile), the process limit (it failed while the sandbox user's tasks
// were at RLIMIT_NPROC, the limit that holds in every sandbox: the pids cgroup is only
// the host's ceiling above it, and the kernel counts no fork RLIMIT_NPROC refuses, so
// the count of the user's tasks as the command ended is the evidence; see
// processLimit), its output cut at the cap.
func endOf(res guest.Result, timedOut, truncated bool, before counts, limit procLimit, timeout time.Duration, cut int64) (string, string) {
	if timedOut {
		why := fmt.Sprintf("killed by roche-agent at its timeout of %s", timeout)
		if limit.full() {
			why += ", with " + limit.String()
		}
		return "command_timeout", why
	}
	if res.ExitCode == 128+int(syscall.SIGKILL) && before.oom >= 0 {
		if now := oomKills(); now > before.oom {
			return "oom", fmt.Sprintf("exit by SIGKILL with the sandbox cgroup's memory.events oom_kill %d -> %d", before.oom, now)
		}
	}
	if res.ExitCode != 0 && limit.full() {
		return "pids", fmt.Sprintf("exit %d with %s", res.ExitCode, limit)
	}
	if truncated {
		return "output_cap", fmt.Sprintf("its output passed the cap of %d bytes per stream and was cut", cut)
	}
	return "", ""
}

// mergeEnv returns base with the overrides applied.
func mergeEnv(base []string, over map[string]string) []string {
	if len(over) == 0 {
		return base
	}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := over[k]; !ok {
			out = append(out, kv)
		}
	}
	for k, v := range over {
		out = append(out, k+"="+v)
	}
	return out
}

var errNotInPath = errors.New("not found in PATH")

// lookPath finds name in the command's PATH.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errNotInPath
}
