package server

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest"
)

// Default terminal size when a request gives none.
const (
	defaultCols = 80
	defaultRows = 24
)

// openPTY opens a new pseudo-terminal pair on the sandbox's devpts: the master stays
// with the agent (pollable, so closing it ends a pending read), the slave becomes the
// command's standard streams and controlling terminal, owned by the sandbox user as
// login programs leave it.
func (s *Server) openPTY(cols, rows uint16) (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, &guest.Error{Code: guest.CodeUnsupported,
				Message: "this sandbox has no /dev/ptmx (no devpts mounted), so it cannot give a terminal"}
		}
		return nil, nil, fmt.Errorf("opening a terminal: %w", err)
	}
	var n int
	ctlErr := control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlocking the terminal: %w", err)
		}
		n, err = unix.IoctlGetInt(fd, unix.TIOCGPTN)
		if err != nil {
			return fmt.Errorf("numbering the terminal: %w", err)
		}
		return nil
	})
	if ctlErr != nil {
		master.Close()
		return nil, nil, ctlErr
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("opening the terminal's /dev/pts/%d: %w", n, err)
	}
	// Best effort: a sandbox whose agent may not chown still gets a working terminal
	// (the descriptors are already open); only tools that reopen it by name would fail.
	if err := os.Chown(slave.Name(), s.uid, s.gid); err != nil {
		s.log.Debug("handing the terminal to the sandbox user", "tty", slave.Name(), "err", err)
	}
	if err := setWinsize(master, cols, rows); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// setWinsize sets a terminal's size; the kernel sends SIGWINCH to its foreground job.
func setWinsize(master *os.File, cols, rows uint16) error {
	if cols == 0 {
		cols = defaultCols
	}
	if rows == 0 {
		rows = defaultRows
	}
	return control(master, func(fd int) error {
		if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows}); err != nil {
			return fmt.Errorf("resizing the terminal: %w", err)
		}
		return nil
	})
}

// control runs f on f's descriptor without master.Fd, which would switch it to blocking
// mode and so stop Close from ending a read in progress.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var inner error
	if err := rc.Control(func(fd uintptr) { inner = fn(int(fd)) }); err != nil {
		return err
	}
	return inner
}

// eofInterval is how often a terminal whose input has ended is checked for a program
// waiting to read (see proc.endInput).
const eofInterval = 20 * time.Millisecond

// endInput ends the terminal's input as a pipe's end ends its reader's: from now on,
// whenever the terminal holds nothing unread, the agent types the terminal's
// end-of-file character (Ctrl-D), so that each time the program waits for input it
// reads the end of it. Typed only once, at the end of the input, it could be lost: a
// line editor (bash's, python's readline) switches the terminal out of line mode as it
// starts, and a Ctrl-D typed before that is kept by the kernel as an empty line, which
// the editor then reads as a NUL byte and waits on for ever. At most one Ctrl-D is
// unread at a time, so a program that reads nothing is sent one.
func (p *proc) endInput() {
	if p.tty == nil || !p.inputEnded.CompareAndSwap(false, true) {
		return
	}
	go func() {
		tick := time.NewTicker(eofInterval)
		defer tick.Stop()
		for {
			if p.finished.Load() || p.ttyClosed.Load() {
				return
			}
			if eof, ok := p.waitingEOF(); ok {
				_ = p.typeInto([]byte{eof})
			}
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
		}
	}()
}

// waitingEOF reports whether nothing typed on the terminal is unread, and its
// end-of-file character (Ctrl-D unless the program set another). It opens the
// terminal's other end for a moment: the input queue is seen from there.
func (p *proc) waitingEOF() (byte, bool) {
	p.ttyMu.Lock()
	defer p.ttyMu.Unlock()
	if p.ttyClosed.Load() {
		return 0, false
	}
	var peer int
	err := control(p.tty, func(fd int) error {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC)
		if errno != 0 {
			return errno
		}
		peer = int(r)
		return nil
	})
	if err != nil {
		return 0, false
	}
	defer unix.Close(peer)
	fds := []unix.PollFd{{Fd: int32(peer), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 0); err != nil || n > 0 {
		return 0, false // something typed is still unread, or the terminal hung up
	}
	eof := byte(4)
	if t, err := unix.IoctlGetTermios(peer, unix.TCGETS); err == nil && t.Cc[unix.VEOF] != 0 {
		eof = t.Cc[unix.VEOF]
	}
	return eof, true
}
