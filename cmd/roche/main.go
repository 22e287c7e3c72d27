// Command roche runs untrusted code in sandboxes with secure defaults. See roche --help.
package main

import (
	"os"

	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

func main() {
	// The microVM providers run each VM's supervisor as this executable.
	supervisor.RunIfAsked()
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
