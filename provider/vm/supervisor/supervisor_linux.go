package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest/vmlink"
	"github.com/roche-sandbox/roche/internal/proctree"
)

// stopGrace is how long the hypervisor has to exit after SIGTERM before SIGKILL.
const stopGrace = 3 * time.Second

// Main runs a supervisor: args is the path of its Spec file.
func Main(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: roche-agent %s SPEC.json (started by the qemu and firecracker providers, not by hand)", Subcommand)
	}
	b, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var spec Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("reading %s: %w", args[0], err)
	}
	if spec.Dir == "" || len(spec.Argv) == 0 {
		return fmt.Errorf("%s: no directory or hypervisor command", args[0])
	}
	return run(spec)
}

func run(spec Spec) error {
	// The hypervisor is killed if the supervisor dies: by the kernel, when the supervisor
	// is the init of its own PID namespace (proc_linux.go); else by its parent-death
	// signal (Pdeathsig), which Linux ties to the thread that forked it: pin this
	// goroutine to its thread for good.
	runtime.LockOSThread()
	report := reportPipe()
	defer func() {
		// A VM saved to disk keeps its directory for the resume.
		if _, err := os.Stat(filepath.Join(spec.Dir, SuspendedFile)); err != nil {
			cleanup(spec)
		}
	}()

	console, err := os.OpenFile(spec.Console, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer console.Close()
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Stdout, cmd.Stderr = console, console
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	var host, guest *os.File
	if spec.Serial {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket pair for the serial link: %w", err)
		}
		host = os.NewFile(uintptr(fds[0]), "vmlink-host")
		guest = os.NewFile(uintptr(fds[1]), "vmlink-guest")
		cmd.ExtraFiles = []*os.File{guest} // fd 3 in the hypervisor
	}
	if spec.Incoming != "" {
		in, err := os.Open(spec.Incoming)
		if err != nil {
			writeReport(report, Report{Exit: fmt.Sprintf("opening the saved VM state: %v", err)})
			return err
		}
		defer in.Close()
		if guest == nil {
			cmd.ExtraFiles = []*os.File{nil}
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, in) // fd 4
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	err = cmd.Start()
	if guest != nil {
		guest.Close() // the hypervisor holds it now; its exit then shows as EOF here
	}
	if err != nil {
		writeReport(report, Report{Exit: fmt.Sprintf("starting %s: %v", spec.Argv[0], err)})
		return err
	}
	// The provider finds the hypervisor by this record, for its memory (snapshots) and
	// to kill it should this supervisor be gone while it runs. It is made before the
	// hypervisor can be reaped, so the pid is still the hypervisor's.
	hv, err := hostPID(cmd.Process.Pid)
	if err == nil {
		err = writeHypervisor(spec.Dir, hv)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err != nil {
		waitErr := stop(cmd, exited)
		writeReport(report, Report{Exit: fmt.Sprintf("recording the hypervisor's pid: %v (%s)", err, describe(waitErr)), Console: consoleTail(spec.Console)})
		return err
	}

	var link *serialLink
	if host != nil {
		link = &serialLink{host: host, socket: spec.AgentSocket, egress: spec.EgressSocket, sw: vmlink.NewSwitch(host, host, false)}
		go link.serve(spec.Relink)
	}
	deadline := time.NewTimer(max(time.Until(time.UnixMilli(spec.DeadlineUnixMS)), 0))
	defer deadline.Stop()
	// SIGUSR1: the provider moved the VM's end (SetTimeout) and rewrote the spec file.
	moved := make(chan os.Signal, 1)
	signal.Notify(moved, syscall.SIGUSR1)
	// SIGUSR2: a snapshot was taken and the VM goes on; its guest waits for a relink.
	relink := make(chan os.Signal, 1)
	signal.Notify(relink, syscall.SIGUSR2)

	var waitErr error
	stopped := ""
wait:
	for {
		select {
		case waitErr = <-exited:
			break wait
		case sig := <-sigs:
			stopped = "stopped by " + sig.String()
			waitErr = stop(cmd, exited)
			break wait
		case <-relink:
			if link != nil {
				if nonce, ok := readRelink(filepath.Join(spec.Dir, SpecFile)); ok {
					go link.relink(nonce)
				}
			}
		case <-moved:
			if ms, ok := readDeadline(filepath.Join(spec.Dir, SpecFile)); ok {
				deadline.Reset(max(time.Until(time.UnixMilli(ms)), 0))
			}
		case <-deadline.C:
			stopped = "stopped at the end of its lifetime"
			waitErr = stop(cmd, exited)
			break wait
		}
	}
	if link != nil {
		link.close()
	}
	exit := describe(waitErr)
	if stopped != "" {
		exit = stopped
	}
	tail := consoleTail(spec.Console)
	if _, err := os.Stat(filepath.Join(spec.Dir, SuspendedFile)); err != nil {
		recordEnd(spec, ended(cmd, hv, waitErr, stopped, tail))
	}
	writeReport(report, Report{Exit: exit, Console: tail})
	return nil
}

var (
	panicLine = regexp.MustCompile(`Kernel panic - not syncing:[^\r\n]*`)
	oomLine   = regexp.MustCompile(`Out of memory: Killed process[^\r\n]*`)
)

// writeHypervisor records the hypervisor's host pid and start time in dir, whole or not
// at all (a rename).
func writeHypervisor(dir string, pid int) error {
	start, err := proctree.StartTime(pid)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, HypervisorFile)
	if err := os.WriteFile(path+".tmp", fmt.Appendf(nil, "%d %d\n", pid, start), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// ended is what is known of the VM's end: how the hypervisor (host pid hv) ended
// (waitErr), whether the supervisor stopped it, and what the guest kernel last said of a
// panic or an OOM kill.
func ended(cmd *exec.Cmd, hv int, waitErr error, stopped, console string) Ended {
	e := Ended{AtUnixMS: time.Now().UnixMilli(), HypervisorPID: hv, Exit: describe(waitErr), Stopped: stopped}
	if st := cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok {
			if ws.Signaled() {
				e.Signal = int(ws.Signal())
			} else {
				e.ExitCode, e.ExitKnown = ws.ExitStatus(), true
			}
		}
	}
	if m := panicLine.FindAllString(console, -1); len(m) > 0 {
		e.Panic = m[len(m)-1]
	}
	if m := oomLine.FindAllString(console, -1); len(m) > 0 {
		e.OOM = m[len(m)-1]
	}
	return e
}

// recordEnd writes e to EndedPath(spec.Dir), whole or not at all (a rename).
func recordEnd(spec Spec, e Ended) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	path := EndedPath(spec.Dir)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		fmt.Fprintf(os.Stderr, "roche-agent %s: recording the VM's end: %v\n", Subcommand, err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
	}
}

// stop asks the hypervisor's process group to end, then kills it.
func stop(cmd *exec.Cmd, exited <-chan error) error {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-exited:
		return err
	case <-time.After(stopGrace):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	return <-exited
}

func describe(err error) string {
	if err == nil {
		return "the hypervisor exited (status 0)"
	}
	return "the hypervisor exited: " + err.Error()
}

// cleanup removes everything the VM had on the host.
func cleanup(spec Spec) {
	for _, d := range spec.RemoveDirs {
		_ = os.RemoveAll(d)
	}
	_ = os.RemoveAll(spec.Dir)
}

// reportPipe is fd 3 when the creator passed one: the creating process reads it while it
// waits for the agent, to tell a VM that died at boot from one that is slow.
func reportPipe() *os.File {
	if _, err := unix.FcntlInt(3, unix.F_GETFD, 0); err != nil {
		return nil
	}
	// Not for the hypervisor: exec would otherwise hand it on.
	unix.CloseOnExec(3)
	return os.NewFile(3, "report")
}

// writeReport never blocks for long: the report is far smaller than a pipe's buffer, and
// once the creator has gone the write fails with EPIPE (fd 3, so no SIGPIPE).
func writeReport(f *os.File, r Report) {
	if f == nil {
		return
	}
	b, _ := json.Marshal(r)
	_, _ = f.Write(append(b, '\n'))
	_ = f.Close()
}

// consoleTail is the end of the console output, where a panic or an init error is.
func consoleTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const tail = 8 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > tail {
		_, _ = f.Seek(fi.Size()-tail, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return strings.ToValidUTF8(string(b), "?")
}

// serialLink serves the agent socket over the VM's serial port: each connection to the
// socket becomes one multiplexed stream to the guest agent. A snapshot moves the guest
// to a new session (relink), which the socket's later connections use.
type serialLink struct {
	host   *os.File
	socket string
	egress string // the egress proxy's socket, or ""
	sw     *vmlink.Switch

	mu     sync.Mutex
	ln     net.Listener
	sess   *yamux.Session
	closed bool
}

// relinkHelloTimeout bounds the wait for a relinked guest's hello: a restored guest
// answers at once, but emulation on a busy host is slow.
const relinkHelloTimeout = 2 * time.Minute

// session waits for the guest's hello (after sending the relink line, when nonce is
// set) and starts a multiplexer session.
func (l *serialLink) session(nonce string, wait time.Duration) (*yamux.Session, error) {
	found := l.sw.Expect([]byte(vmlink.Hello))
	if nonce != "" {
		l.sw.Drop()
		if err := l.sw.Write(vmlink.RelinkLine(nonce)); err != nil {
			return nil, err
		}
	}
	if err := vmlink.ScanHello(found, l.sw.Ended(), wait); err != nil {
		return nil, err
	}
	return yamux.Client(l.sw.Conn(), vmlink.MuxConfig())
}

func (l *serialLink) serve(nonce string) {
	// The socket appears only once the guest agent has said hello, so "the socket
	// exists" already means "the agent is up". A first boot's hello may take the whole
	// boot; the provider bounds that wait itself.
	wait := 24 * time.Hour
	if nonce != "" {
		wait = relinkHelloTimeout
	}
	sess, err := l.session(nonce, wait)
	if err != nil {
		fmt.Fprintf(os.Stderr, "roche-agent %s: %v\n", Subcommand, err)
		return
	}
	_ = os.Remove(l.socket)
	old := syscall.Umask(0o177) // only the owner may connect, from the first moment
	ln, err := net.Listen("unix", l.socket)
	syscall.Umask(old)
	if err != nil {
		sess.Close()
		fmt.Fprintf(os.Stderr, "roche-agent %s: listening on %s: %v\n", Subcommand, l.socket, err)
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		ln.Close()
		sess.Close()
		return
	}
	l.ln, l.sess = ln, sess
	l.mu.Unlock()
	go l.acceptGuest(sess)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		l.mu.Lock()
		sess := l.sess
		l.mu.Unlock()
		go proxy(c, sess)
	}
}

// relink moves to the session a guest starts after a snapshot was taken of it.
func (l *serialLink) relink(nonce string) {
	sess, err := l.session(nonce, relinkHelloTimeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "roche-agent %s: relinking: %v\n", Subcommand, err)
		return
	}
	l.mu.Lock()
	old := l.sess
	if l.closed {
		l.mu.Unlock()
		sess.Close()
		return
	}
	l.sess = sess
	l.mu.Unlock()
	go l.acceptGuest(sess)
	if old != nil {
		old.Close()
	}
}

// acceptGuest takes the streams the guest agent opens over sess, each one connection a
// program in the sandbox made to its HTTP proxy port, and joins each to a connection to
// the sandbox's egress proxy, which decides what it may reach. Nothing else on the host
// is reachable this way: a guest without an egress proxy has its streams closed.
func (l *serialLink) acceptGuest(sess *yamux.Session) {
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			return
		}
		if l.egress == "" {
			st.Close()
			continue
		}
		go joinEgress(st, l.egress)
	}
}

// egressUnreachable is what a program in the sandbox reads when the egress proxy's
// process is not serving it.
const egressUnreachable = "roche egress: the host's proxy is not reachable (is the process that created this sandbox still running?)\n"

func joinEgress(st *yamux.Stream, socket string) {
	up, err := net.DialTimeout("unix", socket, 10*time.Second)
	if err != nil {
		fmt.Fprintf(st, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(egressUnreachable), egressUnreachable)
		st.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, st)
		if uc, ok := up.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
	}()
	_, _ = io.Copy(st, up)
	st.Close()
	<-done
	up.Close()
}

func (l *serialLink) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.ln != nil {
		l.ln.Close()
	}
	if l.sess != nil {
		l.sess.Close()
	}
	l.host.Close()
}

// proxy joins a client connection to a new stream. The client closing its connection
// closes the stream, which the agent sees as the client going away (and so kills a
// foreground command); what the agent still sends after that is drained, so it never
// blocks writing to a reader that has left.
func proxy(c net.Conn, sess *yamux.Session) {
	st, err := sess.OpenStream()
	if err != nil {
		c.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(c, st); err != nil {
			_, _ = io.Copy(io.Discard, st)
		}
		c.Close()
	}()
	_, _ = io.Copy(st, c)
	st.Close()
	<-done
	c.Close()
}

// readDeadline reads the deadline of the spec file the provider rewrote.
func readDeadline(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	var spec Spec
	if err := json.Unmarshal(b, &spec); err != nil || spec.DeadlineUnixMS <= 0 {
		return 0, false
	}
	return spec.DeadlineUnixMS, true
}

// readRelink reads the relink nonce of the spec file the provider rewrote.
func readRelink(path string) (string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	var spec Spec
	if err := json.Unmarshal(b, &spec); err != nil || spec.Relink == "" {
		return "", false
	}
	return spec.Relink, true
}
