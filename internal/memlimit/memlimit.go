// Package memlimit is the soft memory limit a Roche binary keeps (roched's 256 MiB)
// apart from the temporary one internal/initgc holds while packages initialise, so that
// the end of that window leaves the kept one in force. It has no init work of its own:
// importing it changes nothing (importing initgc turns the collector off).
package memlimit

import (
	"math"
	"runtime/debug"
	"sync"
)

var (
	mu   sync.Mutex
	kept int64 = math.MaxInt64
)

// Set sets the process's soft memory limit (debug.SetMemoryLimit) and keeps it.
func Set(limit int64) {
	mu.Lock()
	defer mu.Unlock()
	kept = limit
	debug.SetMemoryLimit(limit)
}

// Lift replaces a temporary limit, if it is still the one in force, with the limit kept
// (none unless Set was called). A limit set since by other means stays. Comparing the
// limit in force with the temporary one alone would not do: roched keeps 256 MiB, the
// value of initgc's window, which the window's end once took for its own and lifted.
func Lift(temporary int64) {
	mu.Lock()
	defer mu.Unlock()
	if debug.SetMemoryLimit(-1) == temporary {
		debug.SetMemoryLimit(kept)
	}
}
