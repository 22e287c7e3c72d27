package kubernetes_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

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
