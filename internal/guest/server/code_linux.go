package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/codectx"
	"github.com/roche-sandbox/roche/internal/guest/kernel"
	"github.com/roche-sandbox/roche/internal/proctree"
	"golang.org/x/sys/unix"
)

// Code contexts: the contexts themselves are internal/guest/codectx's; what is the
// agent's is how a kernel starts, a process as the sandbox user under every limit,
// exactly as a command is, and its output going out as frames.

// codeOp serves the code_* operations.
func (s *Server) codeOp(c *conn, req guest.Request) error {
	if err := checkWorkdir(req.Cwd); err != nil {
		return err
	}
	ctx := context.Background()
	switch req.Op {
	case guest.OpCodeRun:
		return s.runCode(c, req)
	case guest.OpCodeCreate:
		cc, err := s.code.Create(ctx, req.Language, req.Cwd, req.Env)
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, cc)
	case guest.OpCodeList:
		return c.sendJSON(guest.FrameReply, s.code.List())
	case guest.OpCodeRestart:
		if err := s.code.Restart(ctx, req.Context); err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpCodeRemove:
		if err := s.code.Remove(req.Context); err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpCodeFork:
		cc, err := s.code.Fork(ctx, req.Context)
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, cc)
	case guest.OpCodeWarm:
		if err := s.code.Warm(ctx, req.Language, req.Cwd, req.Env); err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	}
	return invalid("unknown operation %q", req.Op)
}

// runCode runs one cell and streams its output, results and end to c. The client going
// away interrupts the cell, as its timeout does.
func (s *Server) runCode(c *conn, req guest.Request) error {
	ctx, gone := context.WithCancel(context.Background())
	defer gone()
	go func() {
		for {
			if _, _, err := c.read(); err != nil {
				gone()
				return
			}
		}
	}()
	tr := newReqTrace(req)
	end, err := s.code.Run(ctx, req, cellFrames{c})
	if err != nil {
		return err
	}
	end.Spans = tr.codeSpans(end)
	return c.sendJSON(guest.FrameCodeEnd, end)
}

// cellFrames sends a cell's output to its client: stdout and stderr frames, and each
// result as the kernel wrote it.
type cellFrames struct{ c *conn }

func (f cellFrames) Write(s codectx.Stream, p []byte) {
	kind := byte(guest.FrameStdout)
	if s == codectx.Stderr {
		kind = guest.FrameStderr
	}
	_ = f.c.send(kind, p)
}

func (f cellFrames) Result(ev codectx.Event) { _ = f.c.send(guest.FrameCodeResult, ev.Raw) }

// kernelProc is a kernel's process (codectx.Proc).
type kernelProc struct {
	pid int
	// reaped is closed once the reaper has waited for the process; status is then how
	// it ended.
	reaped chan struct{}
	status exitStatus
	cmd    *os.File // the kernel's cell pipe
	// oomBefore is the sandbox's OOM-kill count when the running cell was sent; -1
	// before the first, or when unknown.
	oomBefore atomic.Int64

	exitOnce sync.Once
	exit     codectx.Exit
}

func (p *kernelProc) Send(line []byte) error {
	p.oomBefore.Store(oomKills())
	_, err := p.cmd.Write(line)
	return err
}

// Interrupt sends SIGINT; a kernel already gone ends its cell by itself.
func (p *kernelProc) Interrupt() error {
	_ = syscall.Kill(p.pid, syscall.SIGINT)
	return nil
}

func (p *kernelProc) Kill() {
	_ = proctree.KillTree(p.pid)
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	p.cmd.Close()
}

// Gone implements codectx.Gone: the process was reaped, which may come a moment before
// its event pipe is seen to end.
func (p *kernelProc) Gone() bool {
	select {
	case <-p.reaped:
		return true
	default:
		return false
	}
}

func (p *kernelProc) Exit() codectx.Exit {
	p.exitOnce.Do(func() {
		var ws *syscall.WaitStatus
		select {
		case <-p.reaped:
			ws = &p.status.WaitStatus
		case <-time.After(5 * time.Second):
		}
		before := p.oomBefore.Load()
		if ws != nil && ws.Signaled() && ws.Signal() == syscall.SIGKILL && before >= 0 && oomKills() > before {
			p.exit = codectx.Exit{How: "was killed by the out-of-memory killer", OOM: true}
		} else {
			p.exit = codectx.Exit{How: describeExit(ws)}
		}
	})
	return p.exit
}

// startKernel starts a kernel as the sandbox user, in the sandbox's cgroup, as exec
// starts a command (codectx.Options.Start).
func (s *Server) startKernel(_ context.Context, cwd string, extra map[string]string) (*codectx.Kernel, error) {
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
	p := &kernelProc{pid: pid, reaped: make(chan struct{}), cmd: cmdW}
	go func() {
		p.status = <-wait
		close(p.reaped)
	}()
	p.oomBefore.Store(-1)
	k := codectx.NewKernel(p)
	k.PumpRaw(stdoutR, codectx.Stdout)
	k.PumpRaw(stderrR, codectx.Stderr)
	k.PumpEvents(evR)
	return k, nil
}

// forkWait bounds the wait for a forked kernel to come for its fds.
const forkWait = 30 * time.Second

// forkKernel forks parent (codectx.Options.Fork): the new kernel, a copy of parent's
// process orphaned to this agent, comes to an abstract Unix socket of this request for
// its four pipes (stdout, stderr, cells, events), as startKernel gives them.
func (s *Server) forkKernel(ctx context.Context, parent *codectx.Kernel, request func(addr string) error) (*codectx.Kernel, error) {
	addr := "roche-kernel-fork-" + randomName()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + addr, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("forking the python kernel: %w", err)
	}
	defer l.Close()
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
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
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	if err := request(addr); err != nil {
		return nil, fmt.Errorf("asking the python kernel to fork: %w", err)
	}
	deadline := time.Now().Add(forkWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = l.SetDeadline(deadline)
	c, err := l.AcceptUnix()
	if err != nil {
		return nil, fmt.Errorf("the forked python kernel did not come for its pipes: %w", err)
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return nil, fmt.Errorf("who forked: %w", errors.Join(err, cerr))
	}
	pid := int(cred.Pid)
	wait, err := s.reaper.adopt(pid)
	if err != nil {
		return nil, fmt.Errorf("the forked python kernel: %w", err)
	}
	rights := unix.UnixRights(int(stdoutW.Fd()), int(stderrW.Fd()), int(cmdR.Fd()), int(evW.Fd()))
	if _, _, err := c.WriteMsgUnix([]byte{0}, rights, nil); err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		return nil, fmt.Errorf("passing the forked python kernel its pipes: %w", err)
	}
	files = nil
	stdoutW.Close()
	stderrW.Close()
	cmdR.Close()
	evW.Close()
	p := &kernelProc{pid: pid, reaped: make(chan struct{}), cmd: cmdW}
	go func() {
		p.status = <-wait
		close(p.reaped)
	}()
	p.oomBefore.Store(-1)
	k := codectx.NewKernel(p)
	k.PumpRaw(stdoutR, codectx.Stdout)
	k.PumpRaw(stderrR, codectx.Stderr)
	k.PumpEvents(evR)
	return k, nil
}

func randomName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
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
