package initgc

import (
	"math"
	"os"
	"runtime/debug"
	"testing"
	"time"
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
	Restore()
	if got := debug.SetMemoryLimit(-1); got != windowLimit {
		t.Fatalf("memory limit during the window %d, want %d", got, windowLimit)
	}
	time.Sleep(window + 200*time.Millisecond)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GC percent after the window %d, want 100", got)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("memory limit after the window %d, want none", got)
	}
	Restore() // a second call changes nothing
}
