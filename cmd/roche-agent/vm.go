package main

import (
	"os"

	"github.com/roche-sandbox/roche/agent/server"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// vmMode returns what to run instead of serving a container, if anything: the init of a
// microVM (the kernel starts the agent as /init from the initramfs) or the host-side
// supervisor of one (`roche-agent vm-supervise SPEC`, started by the qemu and
// firecracker providers). One binary serves all three roles so that a host needs nothing
// but roche-agent beside roche.
func vmMode() func() error {
	if server.IsVMInit() {
		return server.RunVM
	}
	if len(os.Args) > 1 && os.Args[1] == supervisor.Subcommand {
		return func() error { return supervisor.Main(os.Args[2:]) }
	}
	return nil
}
