package server

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/agent"
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
			return nil, nil, &agent.Error{Code: agent.CodeUnsupported,
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
