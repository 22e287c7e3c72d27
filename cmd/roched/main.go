// Command roched is Roche's daemon: the sandbox API over a unix socket (and TCP with a
// token), warm pools, a reaper and crash recovery. See roched --help.
package main

import (
	"os"

	"github.com/roche-sandbox/roche/agent/agentcmd"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

func main() {
	// Started as roche-agent (a sandbox's PID 1, a microVM's init), this binary is the
	// agent: one static binary has everything.
	agentcmd.RunIfAsked()
	// The microVM providers run each VM's supervisor as this executable.
	supervisor.RunIfAsked()
	os.Exit(daemon.Main(os.Args[1:], os.Stdout, os.Stderr))
}
