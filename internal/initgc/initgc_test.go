package initgc

import (
	"math"
	"os"
	"runtime/debug"
	"testing"
	"testing/synctest"
	"time"

	"github.com/roche-sandbox/roche/internal/memlimit"
)

// TestRestore: the collector is off after init (unless GOGC is set), and Restore turns
// it back on at 100 once its window has passed, the window's memory limit lifted.
func TestRestore(t *testing.T) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("GOGC or GOMEMLIMIT set in the environment, which initgc leaves alone")
	}
	if !off {
		t.Fatal("the collector was not turned off during init")
	}
	synctest.Test(t, func(t *testing.T) {
		Restore()
		if got := debug.SetMemoryLimit(-1); got != windowLimit {
			t.Fatalf("memory limit during the window %d, want %d", got, windowLimit)
		}
		time.Sleep(window + time.Millisecond)
		synctest.Wait()
	})
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GC percent after the window %d, want 100", got)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("memory limit after the window %d, want none", got)
	}
	Restore() // a second call changes nothing
}

// TestKeptLimitOutlivesTheWindow: a limit the command keeps during the window, equal to
// the window's own as roched's is, stays in force after it (it was once lifted with it).
func TestKeptLimitOutlivesTheWindow(t *testing.T) {
	if os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("GOMEMLIMIT set in the environment, which initgc leaves alone")
	}
	defer debug.SetMemoryLimit(math.MaxInt64)
	off = true
	synctest.Test(t, func(t *testing.T) {
		Restore()
		memlimit.Set(windowLimit)
		time.Sleep(window + time.Millisecond)
		synctest.Wait()
	})
	if got := debug.SetMemoryLimit(-1); got != windowLimit {
		t.Fatalf("memory limit after the window %d, want the kept %d", got, windowLimit)
	}
}
