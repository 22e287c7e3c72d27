package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// AwaitFile waits up to d for path to exist with cond holding of it, woken by inotify
// as the entries of path's directory change (made, written, removed, renamed,
// chmodded): the signal that a process has, say, made its socket. It fails the test
// after d.
func AwaitFile(t testing.TB, path, what string, d time.Duration, cond func(os.FileInfo) bool) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	defer unix.Close(fd)
	// Watching before the first look: a change between the two is not missed.
	const changes = unix.IN_CREATE | unix.IN_ATTRIB | unix.IN_MODIFY | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_DELETE | unix.IN_CLOSE_WRITE
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), changes); err != nil {
		t.Fatalf("watching %s: %v", filepath.Dir(path), err)
	}
	deadline := time.Now().Add(d)
	buf := make([]byte, 64<<10)
	for {
		if fi, err := os.Stat(path); err == nil && cond(fi) {
			return
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			t.Fatalf("timed out after %v waiting for %s (%s)", d, what, path)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(wait.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatalf("poll: %v", err)
		}
		for { // drain: the events only say to look again
			if _, err := unix.Read(fd, buf); err != nil {
				break
			}
		}
	}
}

// AwaitExit waits up to d for the processes pids to end (a zombie waiting for its parent
// has ended), woken by their pidfds, and returns those still running then. They need
// not be the test's children.
func AwaitExit(t testing.TB, pids []int, d time.Duration) []int {
	t.Helper()
	var fds []unix.PollFd
	var running []int
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if errors.Is(err, unix.ESRCH) {
			continue // gone already
		}
		if err != nil {
			t.Fatalf("pidfd_open %d: %v", pid, err)
		}
		defer unix.Close(fd)
		fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		running = append(running, pid)
	}
	deadline := time.Now().Add(d)
	for len(fds) > 0 {
		wait := time.Until(deadline)
		if wait <= 0 {
			return running
		}
		if _, err := unix.Poll(fds, int(wait.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatalf("poll: %v", err)
		}
		for i := len(fds) - 1; i >= 0; i-- {
			if fds[i].Revents != 0 {
				fds = append(fds[:i], fds[i+1:]...)
				running = append(running[:i], running[i+1:]...)
			}
		}
	}
	return nil
}
