package kubernetes

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Unit tests of the posture checks' logic; the attacks they answer are made against the
// test cluster in posture_test.go and webhook_test.go.

func TestCheckPosture(t *testing.T) {
	pp := testParams()
	pp.runtimeClass, pp.gvisor = "gvisor", true
	asked, err := podFor(kit.Spec{Config: roche.DefaultConfig()}, pp)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPosture(asked, asked.DeepCopy()); err != nil {
		t.Fatalf("the Pod as asked: %v", err)
	}
	for name, mutate := range map[string]func(*corev1.Pod){
		"runtime class":       func(p *corev1.Pod) { p.Spec.RuntimeClassName = nil },
		"other runtime class": func(p *corev1.Pod) { p.Spec.RuntimeClassName = ptr("runc") },
		"container seccomp":   func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.SeccompProfile = nil },
		"init container seccomp": func(p *corev1.Pod) {
			p.Spec.InitContainers[0].SecurityContext.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined
		},
		"Pod seccomp":    func(p *corev1.Pod) { p.Spec.SecurityContext = nil },
		"container gone": func(p *corev1.Pod) { p.Spec.Containers[0].Name = "other" },
		"another Localhost": func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.SeccompProfile.LocalhostProfile = ptr("lax.json")
		},
		// gVisor's shim reads these: a hint dropped leaves /dev/shm at gVisor's own size,
		// a flag added could change runsc's.
		"gVisor mount hint dropped": func(p *corev1.Pod) { delete(p.Annotations, gvisorMountHint+volumeShm+".options") },
		"gVisor mount hint changed": func(p *corev1.Pod) { p.Annotations[gvisorMountHint+volumeTmp+".options"] = "rw" },
		"gVisor flag added":         func(p *corev1.Pod) { p.Annotations["dev.gvisor.flag.host-uds"] = "all" },
	} {
		made := asked.DeepCopy()
		mutate(made)
		if err := checkPosture(asked, made); !errors.Is(err, roche.ErrUnavailable) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line wrapping ErrUnavailable", name, err)
		}
	}
}

func TestSeccompMissingNamesTheInstall(t *testing.T) {
	p, err := New(WithClientset(fake.NewClientset(), nil), WithAgentImage("roche/agent:x"))
	if err != nil {
		t.Fatal(err)
	}
	msg := `container sandbox (image x): CreateContainerError: failed to create containerd container: cannot load seccomp profile "/var/lib/kubelet/seccomp/roche.json": open /var/lib/kubelet/seccomp/roche.json: no such file or directory`
	err = p.seccompMissing("kubernetes-x", msg)
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), SeccompInstallHint) || !strings.Contains(err.Error(), "--seccomp-profile RuntimeDefault") {
		t.Errorf("the default profile missing: %v, want ErrUnavailable naming %q and RuntimeDefault", err, SeccompInstallHint)
	}
	if err := p.seccompMissing("kubernetes-x", "CreateContainerError: no space left on device"); err != nil {
		t.Errorf("another failure taken for a missing profile: %v", err)
	}
	p.seccomp = SeccompRuntimeDefault
	if err := p.seccompMissing("kubernetes-x", msg); err != nil {
		t.Errorf("with RuntimeDefault: %v", err)
	}
}

func TestRuntimeClassRefused(t *testing.T) {
	p, err := New(WithClientset(fake.NewClientset(), nil), WithAgentImage("roche/agent:x"), WithRuntimeClass("gvisor"))
	if err != nil {
		t.Fatal(err)
	}
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "kubernetes-x", errors.New(`pod rejected: RuntimeClass "gvisor" not found`))
	if err := p.runtimeClassRefused(forbidden); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "no such RuntimeClass") {
		t.Errorf("admission's refusal: %v, want ErrInvalidConfig saying there is no such RuntimeClass", err)
	}
	rbac := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "kubernetes-x", errors.New("User cannot create resource"))
	if err := p.runtimeClassRefused(rbac); err != nil {
		t.Errorf("an RBAC refusal taken for a missing RuntimeClass: %v", err)
	}
	for msg, want := range map[string]bool{
		`Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for "bogus" is configured`: true,
		`Failed to create pod sandbox: runtimeclass.node.k8s.io "gvisor" not found`:                                                          true,
		`Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox`:                                 false,
	} {
		if got := runtimeHandlerMissing(msg); got != want {
			t.Errorf("runtimeHandlerMissing(%q) = %v, want %v", msg, got, want)
		}
	}
	// gVisor's shim on a node whose kubelet root is not the default (its words, seen on
	// the test cluster with a hint naming a volume the Pod lacks).
	unplaced := `Failed to create pod sandbox: rpc error: code = Unknown desc = failed to create containerd task: failed to create shim task: update volume annotations: get volume path for "tmp": unexpected matched volume list []: unknown`
	if !gvisorHintsUnplaced(unplaced) || gvisorHintsUnplaced(`Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox`) {
		t.Errorf("gvisorHintsUnplaced: the shim's failure to place a hint's volume not told from another")
	}
}
