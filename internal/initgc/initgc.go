// Package initgc keeps the garbage collector off while a Roche binary's packages
// initialise, which the CLI pays on every command (the SDKs' CLI transport starts it per
// call). roched's initialisers (client-go's scheme, go-openapi's validators, Docker's
// reference grammar) allocate some 5 MB, nearly all of it kept, and the collector, whose
// first goal is 4 MB, ran twice during them: about a quarter of the start-up of roched
// run as the full CLI (and of roche, when it linked them too). The thin roche's allocate
// a few hundred KB, short of a collection; it keeps the package for what its command
// allocates next.
//
// Go initialises, at each step, the first package by import path whose imports are all
// initialised; this one needs only os, runtime/debug and internal/memlimit, so it runs
// before the heavy ones. main calls Restore first thing, which turns it back on a little
// later. A GOGC set in the environment is left alone.
package initgc

import (
	"math"
	"os"
	"runtime/debug"
	"time"

	"github.com/roche-sandbox/roche/internal/memlimit"
)

// A command that ends within window never collects: turning the collector back on at
// once would start a collection right away, as the heap the initialisers left is above
// its first goal. Meanwhile windowLimit bounds the heap, unless GOMEMLIMIT or the
// command itself set a limit; a limit the command keeps (memlimit.Set, roched's) stays
// after the window.
const (
	window      = 250 * time.Millisecond
	windowLimit = 256 << 20
)

var off bool

func init() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(-1)
		off = true
	}
}

// Restore turns the collector back on (at GOGC=100, the default), window from now, if
// init turned it off.
func Restore() {
	if !off {
		return
	}
	off = false
	limit := os.Getenv("GOMEMLIMIT") == "" && debug.SetMemoryLimit(-1) == math.MaxInt64
	if limit {
		debug.SetMemoryLimit(windowLimit)
	}
	time.AfterFunc(window, func() {
		debug.SetGCPercent(100)
		if limit {
			memlimit.Lift(windowLimit)
		}
	})
}
