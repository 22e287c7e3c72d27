package kubernetes

import (
	"context"
	"fmt"
	"strings"

	"github.com/roche-sandbox/roche"
)

// gVisor Pods. A sandbox's Pod runs in gVisor when its RuntimeClass's handler is gVisor's
// runsc (the test cluster's RuntimeClass gvisor, scripts/k8s/cluster.sh; GKE Sandbox's
// gvisor). The provider cannot read a RuntimeClass's handler with the Role it is given
// (RuntimeClasses are cluster-wide), so it goes by the class's name: one named gvisor, or
// with gvisor or runsc in its name, is taken for gVisor (gvisorClass). What differs there,
// as under the docker provider's --runtime runsc:
//
//   - gVisor charges a task to the user that creates it, and holds root to RLIMIT_NPROC
//     unless it has CAP_SYS_RESOURCE: the agent forks commands as the sandbox user and
//     keeps CAP_SYS_RESOURCE (of gVisor's kernel; commands get no capability at all).
//   - No terminals (gvisorNoTerminals) and no code contexts (a cell past the memory limit
//     ends the whole sandbox, not its interpreter).
//
// Asking for gVisor and getting runc is what the cluster's RuntimeClass decides; the
// provider puts the class on the Pod and checks that it stays there (checkPosture), and
// the agent, started for gVisor (--fork-as-user), refuses to start on any other kernel,
// so a class named for gVisor that runs runc runs no sandbox.

// gvisorClass says whether a RuntimeClass is taken for gVisor's, by its name.
func gvisorClass(name string) bool {
	n := strings.ToLower(name)
	return strings.Contains(n, "gvisor") || strings.Contains(n, "runsc")
}

func (p *Provider) gvisor() bool { return gvisorClass(p.runtimeClass) }

// gvisorNoTerminals is why sandboxes on gVisor have no terminals (as under the docker
// provider's runsc).
const gvisorNoTerminals = "terminals are not offered on gVisor Pods (RuntimeClass %s): its pseudo-terminal does not pass typed input to the shell's line editor; use exec, or a RuntimeClass on runc"

// Shell implements roche.Terminal, refusing on gVisor.
func (p *Provider) Shell(ctx context.Context, id string, req roche.TerminalRequest, tio roche.TerminalIO) (int, error) {
	if p.gvisor() {
		return 0, fmt.Errorf("%w: "+gvisorNoTerminals, roche.ErrUnsupported, p.runtimeClass)
	}
	return p.forwarder.Shell(ctx, id, req, tio)
}

// StartTerminal implements roche.Terminal, refusing on gVisor.
func (p *Provider) StartTerminal(ctx context.Context, id string, req roche.TerminalRequest) (int, error) {
	if p.gvisor() {
		return 0, fmt.Errorf("%w: "+gvisorNoTerminals, roche.ErrUnsupported, p.runtimeClass)
	}
	return p.forwarder.StartTerminal(ctx, id, req)
}
