package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/codectx"
)

// Version is reported by health.
const Version = "1"

// Config is what the agent is started with.
type Config struct {
	// Socket is the unix socket path to listen on.
	Socket string
	// SocketOwner is the host uid that may connect (the socket is chowned to it, mode 0600).
	SocketOwner int
	// User is "uid[:gid]" or a name from the image's /etc/passwd: commands and file
	// operations run as this user.
	User string
	// Lifetime ends the agent, and so the sandbox, after this long (0: never).
	Lifetime time.Duration
	// LeaseGrace, when positive, makes the sandbox leased (agent.OpLease): it stops this
	// long after the last lease holder goes, or FirstLease after the start when no holder
	// ever came (0: agent.DefaultFirstLease).
	LeaseGrace time.Duration
	FirstLease time.Duration
	Log        *slog.Logger
	// Listener, when set, is served instead of a socket at Socket (a microVM's vsock or
	// serial multiplexer; see RunVM).
	Listener net.Listener
	// ConnFD, when positive, is an inherited descriptor holding the one connection a
	// one-shot sandbox's agent serves, instead of a socket at Socket: its end of a
	// socket pair the host made and the runtime passed in. The agent first sends its
	// Health in a reply frame (it is ready), then serves the connection as any other
	// (one request: the command), and stops when it ends. The host's end closing (its
	// creator exited) ends the command and the sandbox at once, as a lost lease does
	// after its grace.
	ConnFD int
	// EgressListen, when set, is the loopback address programs use as their HTTP proxy;
	// connections to it are relayed through EgressDial to the host's egress proxy.
	EgressListen string
	EgressDial   func() (net.Conn, error)
	// Own lists directories handed to the sandbox user at start when root owns them: a
	// fresh workspace volume is created root-owned, and the sandbox must be able to write it.
	Own []string
	// ChownFrom, when positive, is a uid whose files on the root filesystem are handed to
	// the sandbox user at start: in a sandbox made from a snapshot, what the sandbox it
	// was taken of wrote (as another uid) must stay the sandbox's to change.
	ChownFrom int
	// NProc, when positive, caps the processes and threads of the sandbox user
	// (RLIMIT_NPROC, soft and hard, inherited by every command): exactly NProc of them,
	// counted by the kernel per uid, so per sandbox with a uid of its own (the default),
	// whatever else the sandbox's cgroup holds (the agent's threads). Root, the agent,
	// is exempt (on gVisor by keeping CAP_SYS_RESOURCE).
	NProc int
	// ForkAsUser forks every command from a thread that already runs as the sandbox
	// user rather than as root: gVisor charges a task to the user it is created as, so a
	// command started as root and then switched would not count against NProc.
	ForkAsUser bool
	// ScratchMax, when positive, is the most /tmp and /dev/shm may hold: the agent
	// refuses to start unless both are tmpfs of at most that many bytes (a gVisor Pod,
	// where the runtime makes them so only when it honours the Pod's mount hints; where
	// it does not, /tmp is a gofer mount and /dev/shm a tmpfs of gVisor's own size).
	ScratchMax int64
	// NoFile is the open-file limit (RLIMIT_NOFILE, soft and hard) of the agent and so
	// of every command: 0 means agent.OpenFiles, a negative value leaves the limit as
	// the agent was started with. It is only ever lowered.
	NoFile int
	// KeptOutput bounds the output every durable command together keeps, in bytes (0:
	// 256 MiB); past it the oldest goes first (see keptBudget).
	KeptOutput int64
}

// limitOpenFiles lowers the agent's RLIMIT_NOFILE, soft and hard, to n (0:
// agent.OpenFiles; negative: left alone), which every command inherits: a limit already
// lower stays. syscall.Setrlimit, not x/sys, so that the Go runtime stops restoring the
// soft limit it raised at start in the commands it starts.
func limitOpenFiles(n int) error {
	if n < 0 {
		return nil
	}
	if n == 0 {
		n = guest.OpenFiles
	}
	var cur syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &cur); err != nil {
		return fmt.Errorf("reading the open-file limit: %w", err)
	}
	lim := min(uint64(n), cur.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: lim, Max: lim}); err != nil {
		return fmt.Errorf("setting the open-file limit (RLIMIT_NOFILE %d): %w", lim, err)
	}
	return nil
}

// Server is the in-sandbox agent.
type Server struct {
	cfg      Config
	log      *slog.Logger
	uid, gid int
	baseEnv  []string
	reaper   *reaper
	// groups are the agent's supplementary groups, restored after file operations.
	groups []uint32
	// cgroupFD, when positive, is the cgroup every command starts in (set in a microVM,
	// where the agent itself enforces the PID and memory limits; see RunVM).
	cgroupFD int
	// leases is set in Run when the sandbox is leased (Config.LeaseGrace).
	leases *leases
	// life is set in Run when the sandbox has a lifetime (Config.Lifetime); OpLifetime
	// resets it.
	life *lifetime
	// snapHold is the lease hold a memory snapshot takes (snapshot_linux.go).
	snapMu   sync.Mutex
	snapHold bool
	// egressFailures bounds the log lines of egress connections that find no host proxy.
	egressFailures everyMinute

	// code holds the code contexts (code_linux.go).
	code *codectx.Set
	// kept counts the output durable commands keep.
	kept *keptBudget
	// keyMu orders the starts of keyed commands (see exec).
	keyMu sync.Mutex
	// following counts the connections following durable commands (follow).
	following sync.WaitGroup

	mu    sync.Mutex
	procs map[int]*proc // running commands and durable ones by pid
	// keys are the idempotency keys of commands started, to their pids, the oldest
	// first in keyOrder (at most keepKeys).
	keys     map[string]int
	keyOrder []string
	// stopping says why the agent, and so the sandbox, is stopping; "" while it serves.
	stopping string
	// watches counts the files API's open watches (watch_linux.go).
	watches watchSlots
}

// stopAs records why the sandbox is stopping, before its commands are stopped, so that
// each one's client hears it (see proc.finish).
func (s *Server) stopAs(why string) {
	s.mu.Lock()
	if s.stopping == "" {
		s.stopping = why
	}
	s.mu.Unlock()
}

func (s *Server) stopReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopping
}

// New prepares a server: it resolves the sandbox user and drops every capability from
// the bounding set, so nothing the agent starts can ever hold a capability, while the
// agent keeps the few it needs (setuid, kill) in its own effective set.
func New(cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	uid, gid, err := lookupUser(cfg.User)
	if err != nil {
		return nil, err
	}
	reaper := processReaper()
	if reaper.forkErr != nil {
		return nil, fmt.Errorf("dropping the capability bounding set: %w", reaper.forkErr)
	}
	if cfg.NProc > 0 {
		lim := &unix.Rlimit{Cur: uint64(cfg.NProc), Max: uint64(cfg.NProc)}
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, lim); err != nil {
			return nil, fmt.Errorf("setting the sandbox's process limit (RLIMIT_NPROC %d): %w", cfg.NProc, err)
		}
	}
	if err := limitOpenFiles(cfg.NoFile); err != nil {
		return nil, err
	}
	if cfg.ForkAsUser {
		// Only gVisor asks for this (and gives the agent CAP_SYS_RESOURCE with it): a
		// runtime named for gVisor that runs the sandbox on the host's kernel would
		// give the user weaker isolation than asked for, silently. Refused instead.
		if rel, ok := gvisorKernel(); !ok {
			return nil, fmt.Errorf("started for gVisor (--fork-as-user), but the kernel is not gVisor's (release %q): the runtime this sandbox was asked to run under is not gVisor; refusing to run it on the host's kernel", rel)
		}
		if err := reaper.forkAs(uid, gid); err != nil {
			return nil, err
		}
	}
	if cfg.ScratchMax > 0 {
		if err := checkScratch(cfg.ScratchMax, "/tmp", "/dev/shm"); err != nil {
			return nil, err
		}
	}
	gids, err := syscall.Getgroups()
	if err != nil {
		return nil, fmt.Errorf("reading the agent's groups: %w", err)
	}
	groups := make([]uint32, len(gids))
	for i, g := range gids {
		groups[i] = uint32(g)
	}
	s := &Server{
		cfg: cfg, log: cfg.Log, uid: uid, gid: gid, groups: groups,
		baseEnv: os.Environ(),
		reaper:  reaper,
		procs:   map[int]*proc{},
		keys:    map[string]int{},
		kept:    newKeptBudget(cfg.KeptOutput),
	}
	s.code = codectx.New(codectx.Options{Start: s.startKernel, Stopping: s.stopReason, Fork: s.forkKernel})
	return s, nil
}

// Run serves until ctx ends, the lifetime passes, or SIGTERM/SIGINT arrives; then it
// signals every command's process group and returns.
func (s *Server) Run(ctx context.Context) error {
	reserveThreads(guest.ThreadReserve)
	if s.cfg.ChownFrom > 0 && s.cfg.ChownFrom != s.uid {
		if err := chownRoot(s.cfg.ChownFrom, s.uid, s.gid); err != nil {
			return fmt.Errorf("handing uid %d's files to the sandbox user: %w", s.cfg.ChownFrom, err)
		}
	}
	for _, dir := range s.cfg.Own {
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 {
				if err := os.Chown(dir, s.uid, s.gid); err != nil {
					s.log.Warn("handing a directory to the sandbox user", "dir", dir, "err", err)
				}
			}
		}
	}
	ln := s.cfg.Listener
	if s.cfg.ConnFD > 0 {
		c, err := connFromFD(s.cfg.ConnFD)
		if err != nil {
			return err
		}
		ln = newOneConn(c)
	} else if ln == nil {
		_ = os.Remove(s.cfg.Socket)
		// Only the socket's owner may connect: created with a restrictive umask so there is no
		// moment at which it is open to others.
		old := syscall.Umask(0o177)
		var err error
		ln, err = net.Listen("unix", s.cfg.Socket)
		syscall.Umask(old)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", s.cfg.Socket, err)
		}
		if err := os.Chown(s.cfg.Socket, s.cfg.SocketOwner, -1); err != nil && s.cfg.SocketOwner != 0 {
			ln.Close()
			return fmt.Errorf("handing the socket to uid %d: %w", s.cfg.SocketOwner, err)
		}
	}
	defer ln.Close()
	if s.cfg.EgressListen != "" && s.cfg.EgressDial != nil {
		eln, err := net.Listen("tcp", s.cfg.EgressListen)
		if err != nil {
			return fmt.Errorf("listening for egress on %s: %w", s.cfg.EgressListen, err)
		}
		defer eln.Close()
		go s.serveEgress(eln)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.evictLoop(ctx.Done())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	var lifetime <-chan struct{}
	if s.cfg.Lifetime > 0 {
		s.life = newLifetime(s.cfg.Lifetime)
		defer s.life.stop()
		lifetime = s.life.over
	}
	var leaseLost <-chan struct{}
	if s.cfg.LeaseGrace > 0 {
		first := s.cfg.FirstLease
		if first <= 0 {
			first = guest.DefaultFirstLease
		}
		s.leases = newLeases(first, s.cfg.LeaseGrace)
		leaseLost = s.leases.lost
	}
	go func() {
		select {
		case sig := <-sigs:
			s.log.Info("signal received, stopping", "signal", sig)
			// The engine sends SIGTERM to PID 1 when it stops the container (docker stop,
			// an engine shutting down, a destroy that is not a plain kill).
			s.stopAs(fmt.Sprintf("its engine stopped it (roche-agent, its PID 1, got %s)", sigName(sig)))
		case <-lifetime:
			s.log.Info("sandbox lifetime over, stopping")
			s.stopAs(fmt.Sprintf("its lifetime of %s ended", s.life.length()))
		case <-leaseLost:
			s.log.Warn("sandbox lease lost (its creator is gone), stopping")
			s.stopAs("its lease was lost: the process that created it (and held it) is gone")
		case <-ctx.Done():
			s.stopAs("roche-agent is shutting down")
		}
		cancel()
		ln.Close()
	}()

	if oc, ok := ln.(*oneConn); ok {
		// Ready: the host waits for this, as others wait for the socket to answer.
		b, err := json.Marshal(s.health())
		if err == nil {
			err = guest.WriteFrame(oc.c, guest.FrameReply, b)
		}
		if err != nil {
			return fmt.Errorf("telling the host the agent is ready: %w", err)
		}
		go func() {
			<-oc.served
			s.stopAs("its one command ended (a one-shot sandbox)")
			cancel()
			ln.Close()
		}()
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				s.code.Stop()
				s.stopAll()
				s.followersDone(time.Second)
				return nil
			}
			s.log.Warn("accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.serve(c)
	}
}

// stopAll asks every command to stop, then kills what is left.
func (s *Server) stopAll() {
	s.mu.Lock()
	procs := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	}
	// A closed channel once the time is up, so that every command still running then is
	// killed, not only the first.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var killed []*proc
	for _, p := range procs {
		select {
		case <-p.done:
		case <-ctx.Done():
			p.kill()
			killed = append(killed, p)
		}
	}
	// Killed, they end at once: their clients hear why before the agent exits.
	grace, cancelGrace := context.WithTimeout(context.Background(), time.Second)
	defer cancelGrace()
	for _, p := range killed {
		select {
		case <-p.done:
		case <-grace.Done():
			return
		}
	}
}

// sigName names a signal as the kernel's headers do ("SIGTERM").
func sigName(sig os.Signal) string {
	if n, ok := sig.(syscall.Signal); ok {
		switch n {
		case syscall.SIGTERM:
			return "SIGTERM"
		case syscall.SIGINT:
			return "SIGINT"
		case syscall.SIGHUP:
			return "SIGHUP"
		}
	}
	return sig.String()
}

// conn is one client connection: frames in, frames out (writes serialised).
type conn struct {
	c   net.Conn
	r   *bufio.Reader
	wmu sync.Mutex
	buf []byte
}

func (c *conn) send(kind byte, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return guest.WriteFrame(c.c, kind, payload)
}

// sendAfter sends first, when not nil, as a started frame and then the frame of kind,
// both in one write.
func (c *conn) sendAfter(first []byte, kind byte, payload []byte) error {
	if first == nil {
		return c.send(kind, payload)
	}
	var b bytes.Buffer
	b.Grow(2*5 + len(first) + len(payload))
	_ = guest.WriteFrame(&b, guest.FrameStarted, first)
	if err := guest.WriteFrame(&b, kind, payload); err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.c.Write(b.Bytes())
	return err
}

func (c *conn) sendJSON(kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.send(kind, b)
}

func (c *conn) read() (byte, []byte, error) {
	kind, payload, err := guest.ReadFrame(c.r, c.buf)
	if err == nil && cap(payload) > cap(c.buf) {
		c.buf = payload[:0]
	}
	return kind, payload, err
}

// fail sends an error frame built from err.
func (c *conn) fail(err error) {
	var ae *guest.Error
	if !errors.As(err, &ae) {
		ae = &guest.Error{Code: guest.CodeInternal, Message: err.Error()}
	}
	_ = c.sendJSON(guest.FrameError, ae)
}

func (s *Server) serve(nc net.Conn) {
	defer nc.Close()
	c := &conn{c: nc, r: bufio.NewReaderSize(nc, guest.ReaderSize)}
	kind, payload, err := c.read()
	if err != nil {
		return
	}
	if kind != guest.FrameRequest {
		c.fail(invalid("the first frame must be a request"))
		return
	}
	var req guest.Request
	if err := json.Unmarshal(payload, &req); err != nil {
		c.fail(invalid("malformed request: %v", err))
		return
	}
	switch req.Op {
	case guest.OpExec:
		err = s.exec(c, req)
	case guest.OpAttach:
		err = s.attach(c, req)
	case guest.OpPs:
		err = c.sendJSON(guest.FrameReply, s.ps())
	case guest.OpSignal, guest.OpInput, guest.OpResize:
		switch req.Op {
		case guest.OpSignal:
			err = s.signal(req)
		case guest.OpInput:
			err = s.input(req)
		default:
			var p *proc
			if p, err = s.terminal(req); err == nil {
				err = p.resize(guest.Winsize{Cols: req.Cols, Rows: req.Rows})
			}
		}
		if err == nil {
			err = c.sendJSON(guest.FrameReply, struct{}{})
		}
	case guest.OpHealth:
		err = c.sendJSON(guest.FrameReply, s.health())
	case guest.OpUsage:
		var u guest.Usage
		if u, err = s.usage(); err == nil {
			err = c.sendJSON(guest.FrameReply, u)
		}
	case guest.OpLease:
		err = s.lease(c, req)
	case guest.OpLifetime:
		if err = s.setLifetime(req); err == nil {
			err = c.sendJSON(guest.FrameReply, struct{}{})
		}
	case guest.OpSnapshotPrepare:
		err = s.snapshotPrepare(c, req)
	case guest.OpRestored:
		if err = s.restored(req); err == nil {
			err = c.sendJSON(guest.FrameReply, struct{}{})
		}
	case guest.OpCodeRun, guest.OpCodeCreate, guest.OpCodeList, guest.OpCodeRestart, guest.OpCodeRemove, guest.OpCodeWarm, guest.OpCodeFork:
		err = s.codeOp(c, req)
	case guest.OpWrite, guest.OpRead, guest.OpList, guest.OpStat, guest.OpMkdir, guest.OpRemove,
		guest.OpRename, guest.OpUntar, guest.OpTar, guest.OpWalk, guest.OpWatch:
		err = s.files(c, req)
	default:
		err = invalid("unknown operation %q", req.Op)
	}
	if err != nil {
		c.fail(err)
	}
}

func (s *Server) health() guest.Health {
	h := guest.Health{PID: os.Getpid(), Version: Version}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			h.RSSBytes = pages * int64(os.Getpagesize())
		}
	}
	s.mu.Lock()
	h.Procs = len(s.procs)
	s.mu.Unlock()
	return h
}

func invalid(format string, args ...any) error {
	return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &guest.Error{Code: guest.CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

// lookupUser resolves "uid[:gid]" or a user name from /etc/passwd.
func lookupUser(spec string) (uid, gid int, err error) {
	if spec == "" {
		return 0, 0, errors.New("no sandbox user given")
	}
	name, group, hasGroup := strings.Cut(spec, ":")
	uid, err = strconv.Atoi(name)
	gid = uid
	if err != nil {
		u, g, ok := passwdLookup(name)
		if !ok {
			return 0, 0, fmt.Errorf("user %q is neither a number nor in the image's /etc/passwd", name)
		}
		uid, gid = u, g
	}
	if hasGroup {
		if gid, err = strconv.Atoi(group); err != nil {
			return 0, 0, fmt.Errorf("group %q is not a number", group)
		}
	}
	return uid, gid, nil
}

func passwdLookup(name string) (uid, gid int, ok bool) {
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 4 && f[0] == name {
			u, err1 := strconv.Atoi(f[2])
			g, err2 := strconv.Atoi(f[3])
			return u, g, err1 == nil && err2 == nil
		}
	}
	return 0, 0, false
}

// dropBoundingSet removes every capability from the calling thread's bounding set
// (needs CAP_SETPCAP), on a thread locked to its goroutine: the one that forks the
// agent's commands (reaper.forkThread). The agent keeps its own permitted and effective
// sets; its children can gain nothing.
func dropBoundingSet() error {
	for _, c := range boundingSet() {
		if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 && e != syscall.EINVAL {
			return fmt.Errorf("capability %d: %w", c, e)
		}
	}
	return nil
}

// boundingSet lists the capabilities in the calling thread's bounding set, asked of
// the kernel one by one (prctl PR_CAPBSET_READ, a cheap system call), every one whose
// presence cannot be read included: dropping only the few a sandbox starts with (the
// providers' agent capabilities), not all forty-one (each drop commits new
// credentials). Not read from /proc/thread-self/status: once a /proc entry of a thread
// other than the process's first has been looked up, the reaper of the process pays
// for it when the process ends (the kernel invalidates the thread's /proc dentries,
// walking them: 5 to 6 ms measured here), and for PID 1 that is the runtime, at every
// sandbox's end.
func boundingSet() []int {
	last := 63
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	return capsWhere(last, func(c int) (bool, error) {
		r, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_CAPBSET_READ, uintptr(c), 0)
		if e != 0 {
			return false, e
		}
		return r == 1, nil
	})
}

// capsWhere lists the capabilities up to last that has reports held, or cannot tell.
func capsWhere(last int, has func(int) (bool, error)) []int {
	var caps []int
	for c := 0; c <= last; c++ {
		if held, err := has(c); held || err != nil {
			caps = append(caps, c)
		}
	}
	return caps
}

// reserveThreads makes the runtime create threads until the process has n, so that it
// does not need a new one while a fork bomb holds every free PID (see
// agent.ThreadReserve). Goroutines lock a thread each and keep it until the process has
// n: a locked goroutine may take a thread the runtime already had idle, so the count,
// not the number of goroutines, says when there are enough. Each round locks as many as
// are missing at once, so the count (a read of /proc/self/status, which costs as much
// as a thread) is taken a few times rather than once per thread. Released, the threads
// stay with the runtime, idle.
func reserveThreads(n int) {
	release := make(chan struct{})
	defer close(release)
	for added := 0; added < 4*n; {
		short := n - countThreads()
		if short <= 0 {
			return
		}
		var locked sync.WaitGroup
		locked.Add(short)
		for range short {
			go func() {
				runtime.LockOSThread()
				locked.Done()
				<-release
				runtime.UnlockOSThread()
			}()
		}
		locked.Wait()
		added += short
	}
}

func countThreads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// gvisorKernel reports whether the agent runs on gVisor's kernel, which names its
// release "...-gvisor" (4.19.0-gvisor by default), and the release it read.
// checkScratch refuses scratch mounts that are not tmpfs of at most max bytes (see
// Config.ScratchMax), in one line saying which and what it is instead.
func checkScratch(max int64, paths ...string) error {
	for _, p := range paths {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			return fmt.Errorf("started to hold %s to %d bytes (--scratch-max), but cannot read its filesystem: %w", p, max, err)
		}
		size := int64(st.Blocks) * st.Bsize
		switch {
		case st.Type != unix.TMPFS_MAGIC:
			return fmt.Errorf("started to hold %s to a tmpfs of %d bytes (--scratch-max), but it is not tmpfs (filesystem type %#x): the runtime did not apply the sandbox's mount hints (on gVisor, containerd's runsc runtime must pass dev.gvisor.* annotations: pod_annotations); refusing to run without the bound", p, max, st.Type)
		case size > max:
			return fmt.Errorf("started to hold %s to a tmpfs of %d bytes (--scratch-max), but it is a tmpfs of %d: the runtime did not apply the sandbox's mount hints (on gVisor, containerd's runsc runtime must pass dev.gvisor.* annotations: pod_annotations); refusing to run without the bound", p, max, size)
		}
	}
	return nil
}

func gvisorKernel() (string, bool) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", false
	}
	rel := unix.ByteSliceToString(u.Release[:])
	return rel, strings.HasSuffix(rel, "-gvisor")
}
