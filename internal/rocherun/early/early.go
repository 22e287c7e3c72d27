// Package early makes the thin roche's early hand-off of a one-shot roche run to
// roche-run (rocherun.Early) as it initialises: imported by cmd/roche alone, for that
// side effect. Go initialises a package as soon as its imports are and no package
// before it by import path is waiting, so with its few imports (none that Go
// initialises late, as path, path/filepath and os/user: cmd/roche's TestEarlyHandOff)
// it runs before the packages the thin roche's own commands need (protobuf's
// descriptors, the API's, roched's client, the command line: ~3 of the ~5.5 ms roche
// took before it replaced itself with roche-run).
// When it hands the command over, this process becomes roche-run and nothing else of
// roche runs; otherwise it returns, and roche starts as usual.
package early

import (
	"os"
	"runtime"
	"strings"
	"syscall"

	"github.com/roche-sandbox/roche/internal/rocherun"
)

func init() {
	// As roche (not as roche-agent, which a binary carrying the agent may be started
	// as, nor as a microVM's init), on Linux, where os.Executable reads /proc/self/exe,
	// the binary's own path with its symbolic links resolved (elsewhere roche's own
	// hand-off resolves them).
	if runtime.GOOS != "linux" || len(os.Args) < 2 || os.Getpid() == 1 {
		return
	}
	if name := os.Args[0][strings.LastIndexByte(os.Args[0], '/')+1:]; name != "roche" {
		return
	}
	run, ok := rocherun.Early(os.Args[1:], os.Getenv, os.Executable)
	if !ok {
		return
	}
	// The same arguments, environment and standard streams as cli.handoff passes; on
	// failure (a roche-run that does not start) roche goes on, and its own hand-off
	// says why and falls back to roched.
	_ = syscall.Exec(run, os.Args, os.Environ())
}
