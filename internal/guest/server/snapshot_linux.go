package server

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
)

// relinkListener serves a microVM's serial port as a listener whose multiplexer session
// can be given up and started again (guest.OpSnapshotPrepare): a VM restored from a
// memory snapshot is reached by a new host process over a new link, while this agent
// still holds the old session.
type relinkListener struct {
	sw    *vmlink.Switch
	conns chan net.Conn
	lost  chan struct{}
	once  sync.Once

	mu        sync.Mutex
	sess      *yamux.Session
	relinking bool
}

func newRelinkListener(port *os.File) (*relinkListener, error) {
	l := &relinkListener{sw: vmlink.NewSwitch(port, port, true), conns: make(chan net.Conn), lost: make(chan struct{})}
	if err := l.start(); err != nil {
		return nil, err
	}
	return l, nil
}

// start greets the host and serves a new session.
func (l *relinkListener) start() error {
	c := l.sw.Conn()
	if err := l.sw.Write([]byte(vmlink.Hello)); err != nil {
		return fmt.Errorf("greeting the host on the serial port: %w", err)
	}
	sess, err := yamux.Server(c, vmlink.MuxConfig())
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.sess, l.relinking = sess, false
	l.mu.Unlock()
	go l.accept(sess)
	return nil
}

func (l *relinkListener) accept(sess *yamux.Session) {
	for {
		c, err := sess.Accept()
		if err != nil {
			l.mu.Lock()
			current := l.sess == sess && !l.relinking
			l.mu.Unlock()
			if current {
				// The host end of the serial line is gone: nobody can reach this VM.
				l.once.Do(func() { close(l.lost) })
			}
			return
		}
		select {
		case l.conns <- c:
		case <-l.lost:
			c.Close()
			return
		}
	}
}

// prepare starts watching for the host's relink line (before the answer goes out, so
// no line can arrive unseen); the returned finish, called once the answer is sent,
// gives up the session and greets again when the line comes.
func (l *relinkListener) prepare(nonce string) (finish func()) {
	l.mu.Lock()
	l.relinking = true
	old := l.sess
	l.mu.Unlock()
	found := l.sw.Expect(vmlink.RelinkLine(nonce))
	return func() {
		l.sw.Drop()
		old.Close()
		go func() {
			select {
			case <-found:
			case <-l.sw.Ended():
				l.once.Do(func() { close(l.lost) })
				return
			}
			if err := l.start(); err != nil {
				fmt.Fprintf(os.Stderr, "roche-agent: relinking after a snapshot: %v\n", err)
				l.once.Do(func() { close(l.lost) })
			}
		}()
	}
}

func (l *relinkListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.lost:
		return nil, net.ErrClosed
	}
}

func (l *relinkListener) Close() error {
	l.once.Do(func() { close(l.lost) })
	l.mu.Lock()
	sess := l.sess
	l.mu.Unlock()
	return sess.Close()
}

// openToHost opens a stream to the host over the current session: the host's
// supervisor hands each to the sandbox's egress proxy (vmlink.GuestConfig.EgressListen).
func (l *relinkListener) openToHost() (net.Conn, error) {
	l.mu.Lock()
	sess, relinking := l.sess, l.relinking
	l.mu.Unlock()
	if sess == nil || relinking {
		return nil, fmt.Errorf("the link to the host is being moved")
	}
	return sess.Open()
}

func (l *relinkListener) Addr() net.Addr { return vmlinkAddr{} }

type vmlinkAddr struct{}

func (vmlinkAddr) Network() string { return "virtio-serial" }
func (vmlinkAddr) String() string  { return vmlink.SerialPortName }

// snapshotPrepare serves guest.OpSnapshotPrepare.
func (s *Server) snapshotPrepare(c *conn, req guest.Request) error {
	l, ok := s.cfg.Listener.(*relinkListener)
	if !ok {
		return &guest.Error{Code: guest.CodeUnsupported, Message: "memory snapshots need a microVM's serial link"}
	}
	if len(req.Nonce) < 16 {
		return invalid("snapshot_prepare needs a nonce of at least 16 characters")
	}
	s.snapMu.Lock()
	if s.leases != nil && !s.snapHold && s.leases.hold() {
		s.snapHold = true // the old link's lease holders go with it; the restorer takes it anew
	}
	s.snapMu.Unlock()
	finish := l.prepare(req.Nonce)
	err := c.sendJSON(guest.FrameReply, struct{}{})
	finish()
	return err
}

// restored serves guest.OpRestored.
func (s *Server) restored(req guest.Request) error {
	if len(req.Seed) < 32 {
		return invalid("restored needs a seed of at least 32 bytes")
	}
	if err := reseed(req.Seed); err != nil {
		return err
	}
	// Python's random module seeded itself before the snapshot: its state is memory,
	// which every copy shares.
	s.code.Reseed()
	if req.TimeUnixNS > 0 {
		// adjtimex, not clock_settime: the agent's own seccomp filter refuses the latter
		// (and settimeofday) for it and every command; without CAP_SYS_TIME, commands
		// cannot set the time through adjtimex either.
		off := time.Until(time.Unix(0, req.TimeUnixNS))
		tx := unix.Timex{Modes: adjSetOffset | adjNano}
		sec, nsec := int64(off/time.Second), int64(off%time.Second)
		if nsec < 0 {
			sec, nsec = sec-1, nsec+int64(time.Second)
		}
		tx.Time = unix.Timeval{Sec: sec, Usec: nsec}
		if _, err := unix.Adjtimex(&tx); err != nil {
			return fmt.Errorf("setting the clock: %w", err)
		}
	}
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			return fmt.Errorf("setting the hostname: %w", err)
		}
	}
	if req.LifetimeMS > 0 && s.life != nil {
		s.life.set(time.Duration(min(req.LifetimeMS, maxLifetimeMS)) * time.Millisecond)
	}
	s.snapMu.Lock()
	if s.snapHold {
		s.snapHold = false
		s.leases.release()
	}
	s.snapMu.Unlock()
	return nil
}

// adjtimex modes (linux/timex.h), not in x/sys/unix.
const (
	adjSetOffset = 0x0100
	adjNano      = 0x2000
)

// reseed mixes seed into the kernel's input pool and makes its generator take a new key
// from it at once (RNDRESEEDCRNG), so getrandom and /dev/urandom differ from those of
// every other VM restored from the same memory. Without the reseed the new entropy would
// only be used at the generator's next scheduled reseed, up to a minute later.
func reseed(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reseeding: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(seed))
	*(*int32)(unsafe.Pointer(&info[0])) = int32(len(seed) * 8)
	*(*int32)(unsafe.Pointer(&info[4])) = int32(len(seed))
	copy(info[8:], seed)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); errno != 0 {
		return fmt.Errorf("reseeding: RNDADDENTROPY: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("reseeding: RNDRESEEDCRNG: %w", errno)
	}
	return nil
}
