// Command roche-pause is the test cluster's Pod sandbox ("pause") process: it holds a Pod's
// namespaces open until it is signalled. The test cluster has no image registry, so the
// kubelet's usual pause image cannot be pulled; scripts/k8s/cluster.sh builds this static
// binary into an image from scratch and names it containerd's sandbox_image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// With a shared PID namespace the sandbox is PID 1 and inherits orphans: reap them
		// so they do not stay zombies.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
