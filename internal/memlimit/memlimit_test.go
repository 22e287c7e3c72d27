package memlimit

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestLiftKeepsTheKeptLimit: a temporary limit lifted after Set of the same value leaves
// that value; without Set it leaves none; a limit set since by other means stays.
func TestLiftKeepsTheKeptLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	const temp = 256 << 20

	debug.SetMemoryLimit(temp)
	Lift(temp)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("nothing kept: limit %d after Lift, want none", got)
	}

	debug.SetMemoryLimit(temp)
	Set(temp)
	Lift(temp)
	if got := debug.SetMemoryLimit(-1); got != temp {
		t.Fatalf("kept %d: limit %d after Lift, want it kept", temp, got)
	}

	debug.SetMemoryLimit(1 << 30)
	Lift(temp)
	if got := debug.SetMemoryLimit(-1); got != 1<<30 {
		t.Fatalf("a limit set since: %d after Lift, want it left", got)
	}
	mu.Lock()
	kept = math.MaxInt64
	mu.Unlock()
}
