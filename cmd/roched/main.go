// Command roched is Roche's daemon: the sandbox API over a unix socket (and TCP with a
// token), warm pools, a reaper and crash recovery. See roched --help.
//
// It is also the full roche CLI: started as roche (by the thin roche binary, for a
// command that needs a provider in its own process), it runs that command with every
// provider linked in.
package main

import (
	"os"
	"path/filepath"

	"github.com/roche-sandbox/roche/internal/guest/guestcmd"

	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/cli/full"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/e2b"
	"github.com/roche-sandbox/roche/internal/initgc"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

func main() {
	// The collector was off while the packages initialised (see initgc).
	initgc.Restore()
	// Started as roche-agent (a sandbox's PID 1, a microVM's init), this binary is the
	// agent: one static binary has everything.
	guestcmd.RunIfAsked()
	// The microVM providers run each VM's supervisor as this executable.
	supervisor.RunIfAsked()
	if filepath.Base(os.Args[0]) == "roche" {
		os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, full.Local{}))
	}
	// The E2B listener (--e2b-listen) depends on the daemon, so it is handed in here.
	os.Exit(daemon.Main(os.Args[1:], os.Stdout, os.Stderr, e2b.New))
}
