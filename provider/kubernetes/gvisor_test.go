package kubernetes_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// runscShim is containerd's runtime for gVisor's shim, which the test cluster's runsc
// handler names (runc's is io.containerd.runc.v2).
const runscShim = "io.containerd.runsc.v1"

// TestGVisor: a sandbox asked for gVisor (--runtime-class gvisor, the RuntimeClass of the
// node's runsc handler) runs in gVisor, never silently under runc. From the host, every
// container of its Pod, the agent's installer included, is one of containerd's runsc
// shim's; from inside, the kernel the sandbox's code talks to is gVisor's: its
// /proc/version is gVisor's, not the host's. (A RuntimeClass whose handler the node lacks, and one the cluster does
// not define, fail the create: TestRuntimeClass.)
func TestGVisor(t *testing.T) {
	c := testcluster.Start(t)
	p := newProvider(t, kubernetes.WithRuntimeClass(testcluster.RuntimeClassGVisor))
	sb := create(t, p, baseConfig())

	pod := podOf(t, p, sb.ID)
	if got := pod.Spec.RuntimeClassName; got == nil || *got != testcluster.RuntimeClassGVisor {
		t.Fatalf("the Pod's RuntimeClass %v, want %s", got, testcluster.RuntimeClassGVisor)
	}
	// The stored Pod keeps every default of a runc one (TestPodSpecOnTheCluster), and
	// carries gVisor's mount hints: /tmp and /dev/shm tmpfs of gVisor's kernel, 64 MiB.
	if *pod.Spec.AutomountServiceAccountToken || *pod.Spec.EnableServiceLinks || pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		t.Errorf("gVisor Pod spec %+v", pod.Spec)
	}
	for _, ct := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		sc := ct.SecurityContext
		if sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeLocalhost || *sc.SeccompProfile.LocalhostProfile != kubernetes.DefaultSeccompProfile ||
			*sc.AllowPrivilegeEscalation || *sc.Privileged || !*sc.ReadOnlyRootFilesystem || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("container %s of the gVisor Pod: security context %+v", ct.Name, sc)
		}
	}
	for _, v := range []string{"tmp", "shm"} {
		for field, want := range map[string]string{"type": "tmpfs", "share": "container", "options": "rw,size=67108864"} {
			if k := "dev.gvisor.spec.mount." + v + "." + field; pod.Annotations[k] != want {
				t.Errorf("the gVisor Pod's annotation %s %q, want %q", k, pod.Annotations[k], want)
			}
		}
	}
	statuses := append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...)
	if len(statuses) < 2 {
		t.Fatalf("%d container statuses, want the installer's and the sandbox's", len(statuses))
	}
	for _, st := range statuses {
		rt, err := c.ContainerRuntime(st.ContainerID)
		if err != nil {
			t.Fatal(err)
		}
		if rt != runscShim {
			t.Errorf("container %s (%s) runs under %q, want gVisor's %s", st.Name, st.ContainerID, rt, runscShim)
		}
	}

	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	got := py(t, p, sb.ID, "print(open('/proc/version').read().strip())")
	if got == strings.TrimSpace(string(host)) || !strings.Contains(got, "gvisor") {
		t.Errorf("/proc/version inside %q (the host's %q), want gVisor's own: the sandbox runs on the host's kernel", got, strings.TrimSpace(string(host)))
	}
	t.Logf("inside: %s", got)

	// What gVisor cannot serve is refused in one line, not half done.
	if _, err := p.StartTerminal(context.Background(), sb.ID, roche.TerminalRequest{}); !errors.Is(err, roche.ErrUnsupported) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "gVisor") {
		t.Errorf("a terminal on a gVisor Pod: %v, want one line wrapping ErrUnsupported", err)
	}
	if caps := p.Capabilities(); len(caps.Code) > 0 {
		t.Errorf("code contexts offered on gVisor Pods: %v", caps.Code)
	}
}
