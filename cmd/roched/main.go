// Command roched is Roche's daemon: the sandbox API over a unix socket (and TCP with a
// token), warm pools, a reaper and crash recovery. See roched --help.
package main

import (
	"os"

	"github.com/roche-sandbox/roche/internal/daemon"
)

func main() {
	os.Exit(daemon.Main(os.Args[1:], os.Stdout, os.Stderr))
}
