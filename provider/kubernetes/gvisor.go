package kubernetes

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

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

// gVisor's mount hints: Pod annotations (dev.gvisor.spec.mount.VOLUME.FIELD) that
// gVisor's containerd shim reads (gvisor.dev/gvisor pkg/shim/v1/utils/volumes.go, at the
// version scripts/runsc.sh pins) and runsc applies (runsc/boot/mount_hints.go). Without
// them a memory emptyDir reaches gVisor as a bind mount of the node's tmpfs, served
// through its gofer (9p, not tmpfs), and /dev/shm as a tmpfs of gVisor's kernel of its
// default size (half its memory), not the Pod's: with them both are tmpfs of gVisor's
// own kernel, sized. type tmpfs on a memory emptyDir (the shim finds the volume under
// the kubelet's pods directory and adds its source); share container, the one
// container that mounts it (a tmpfs mounted once, which the sandbox container's mount
// of the volume binds); options, the master mount's: rw and size, which gVisor's tmpfs
// enforces (ENOSPC past it). No nosuid or nodev there: gVisor refuses a container mount
// without nosuid of a master that has it, and the kubelet's mount has neither (as
// under runc, and moot for the same reasons: docs/providers/kubernetes.md). The node's
// containerd must pass the annotations to the shim (its runsc runtime's pod_annotations,
// "dev.gvisor.*"); checkPosture refuses a Pod stored with other dev.gvisor.* annotations
// than those asked for.
const gvisorMountHint = "dev.gvisor.spec.mount."

// gvisorAnnotations is the prefix of every annotation gVisor's shim reads from a Pod.
const gvisorAnnotations = "dev.gvisor."

// gvisorMountHints puts the mount hints of the sandbox's /tmp and /dev/shm volumes,
// each of size bytes, on pod.
func gvisorMountHints(pod *corev1.Pod, size int64) {
	for _, v := range []string{volumeTmp, volumeShm} {
		pod.Annotations[gvisorMountHint+v+".type"] = "tmpfs"
		pod.Annotations[gvisorMountHint+v+".share"] = "container"
		pod.Annotations[gvisorMountHint+v+".options"] = "rw,size=" + strconv.FormatInt(size, 10)
	}
}

// gvisorHintsUnplaced reports whether a FailedCreatePodSandBox message is gVisor's shim
// failing to find a volume its mount hints name (a node whose kubelet keeps its root
// elsewhere than /var/lib/kubelet): the kubelet retries that for ever, so the create
// fails at once.
func gvisorHintsUnplaced(msg string) bool {
	return strings.Contains(msg, "update volume annotations") && strings.Contains(msg, "get volume path")
}

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
