package oci

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// socketWatch sees roche-agent's socket appear in the sandbox's run directory (bound
// into the sandbox, so the agent's bind(2) there is a creation in the host's directory):
// set up before the runtime starts the sandbox, it lets the wait for the agent begin
// when the socket is made rather than at the next round of a poll, whose pauses grow to
// 5 ms, a tenth of a one-shot roche run.
type socketWatch struct {
	f    *os.File
	path string
}

// watchSocket watches for path to be made; nil (the wait then returns at once and the
// agent is polled for, as before) when inotify is not available.
func watchSocket(path string) *socketWatch {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil
	}
	// Non-blocking, so in Go's poller: a read deadline ends a wait.
	return &socketWatch{f: os.NewFile(uintptr(fd), "inotify"), path: path}
}

// wait returns once the socket exists, or ctx ends.
func (w *socketWatch) wait(ctx context.Context) {
	if w == nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { w.f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, 4096)
	for ctx.Err() == nil {
		if _, err := os.Lstat(w.path); err == nil {
			return
		}
		// Any event in the directory is a reason to look again.
		if _, err := w.f.Read(buf); err != nil {
			return
		}
	}
}

// close lets go of the watch without waiting for it: the kernel's release of an inotify
// instance that held a watch waits for a grace period of fsnotify's marks (an SRCU
// synchronize, 9 to 16 ms measured here), which a create has no reason to sit out. The
// descriptor is closed on a goroutine of its own; a process that exits before it is
// done waits for it in its exit, which a one-shot run reaches well after (the command's
// exec and the teardown come first).
func (w *socketWatch) close() {
	if w != nil {
		go w.f.Close()
	}
}
