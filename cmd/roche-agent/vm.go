package main

import "github.com/roche-sandbox/roche/agent/server"

// vmMode returns what to run instead of serving a container, if anything: the init of a
// microVM (the kernel starts the agent as /init from the initramfs). The VM's host-side
// supervisor is not here: it runs as the program hosting the provider (see
// provider/vm/supervisor.RunIfAsked).
func vmMode() func() error {
	if server.IsVMInit() {
		return server.RunVM
	}
	return nil
}
