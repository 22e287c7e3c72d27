// Command roche runs untrusted code in sandboxes with secure defaults. See roche --help.
package main

import (
	"os"

	"github.com/roche-sandbox/roche/agent/agentcmd"

	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/initgc"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

func main() {
	// The collector was off while the packages initialised (see initgc).
	initgc.Restore()
	// Started as roche-agent (a sandbox's PID 1, a microVM's init), this binary is the
	// agent: one static binary has everything.
	agentcmd.RunIfAsked()
	// The microVM providers run each VM's supervisor as this executable.
	supervisor.RunIfAsked()
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
