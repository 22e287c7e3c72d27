//go:build !linux

package testenv

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// AwaitFile waits up to d for path to exist with cond holding of it (polling: inotify is
// Linux's).
func AwaitFile(t testing.TB, path, what string, d time.Duration, cond func(os.FileInfo) bool) {
	t.Helper()
	Eventually(t, d, what, func() bool {
		fi, err := os.Stat(path)
		return err == nil && cond(fi)
	})
}

// AwaitExit waits up to d for the processes pids to end, and returns those still
// running then (polling: pidfds are Linux's).
func AwaitExit(t testing.TB, pids []int, d time.Duration) []int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var running []int
		for _, pid := range pids {
			if p, err := os.FindProcess(pid); err == nil && p.Signal(syscall.Signal(0)) == nil {
				running = append(running, pid)
			}
		}
		if len(running) == 0 || time.Now().After(deadline) {
			return running
		}
		time.Sleep(20 * time.Millisecond)
	}
}
