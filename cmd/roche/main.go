// Command roche runs untrusted code in sandboxes with secure defaults. See roche --help.
//
// roche is the thin binary: the command line and roched's client, and no provider, so
// that it starts in a few milliseconds (the SDKs' CLI transport starts it per call).
// A command that needs a provider in this process (no roched answers, it does not serve
// that provider, or --direct), the kubernetes provider's tools or the MCP server runs in
// roched, the full binary, which roche replaces itself with: found beside roche (its
// symlinks resolved), else on PATH. TestThin keeps the providers out.
package main

import (
	"os"

	"github.com/roche-sandbox/roche/internal/guest/guestcmd"

	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/initgc"
	// A one-shot roche run with no roched goes to roche-run as this package
	// initialises, before the rest of roche's (see rocherun.Early).
	_ "github.com/roche-sandbox/roche/internal/rocherun/early"
)

func main() {
	// The collector was off while the packages initialised (see initgc).
	initgc.Restore()
	// Started as roche-agent (ROCHE_AGENT may name this binary), it is the agent, which
	// costs little to carry. The providers that run it are roched's.
	guestcmd.RunIfAsked()
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, nil))
}
