//go:build !linux

package testenv

import (
	"os"
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
