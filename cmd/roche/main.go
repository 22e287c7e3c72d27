// Command roche runs untrusted code in sandboxes with secure defaults. See roche --help.
package main

import (
	"os"

	"github.com/roche-sandbox/roche/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
