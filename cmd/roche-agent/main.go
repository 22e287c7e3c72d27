// Command roche-agent runs as PID 1 inside every sandbox and serves exec, signals,
// background processes and files over a unix socket (see package guest). It is built
// static (CGO_ENABLED=0) and bind-mounted read-only into the sandbox by the provider.
// roche and roched carry the same agent (package guestcmd); this smaller binary is
// what providers prefer when it is beside them (a microVM's initramfs holds it).
package main

import (
	"os"

	"github.com/roche-sandbox/roche/internal/guest/guestcmd"
)

func main() {
	os.Exit(guestcmd.Main(os.Args[1:], os.Stdout, os.Stderr))
}
