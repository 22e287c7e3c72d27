package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Unit tests of WithSimulatedNodes' logic; internal/k8sscale runs it through roched on
// the test cluster's kwok nodes.

// TestSimulatedCreateTakesRunningAsReady: the Pod goes to the selected nodes, tolerating
// their taint, and the create returns once it is Running, with no agent asked (there is
// no REST config here, so an agent wait would last the create timeout).
func TestSimulatedCreateTakesRunningAsReady(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithNamespace("ns"), WithSimulatedNodes("type=kwok"), WithCreateTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if p.AgentImage() == "" || !p.Simulated() {
		t.Fatalf("agent image %q, simulated %v", p.AgentImage(), p.Simulated())
	}
	if err := p.Available(); err != nil {
		t.Fatalf("Available: %v, want nil (no local roche-agent is needed)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// What kwok does: the Pod, once made, is Running.
	made, err := cs.CoreV1().Pods("ns").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer made.Stop()
	go func() {
		for ev := range made.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				pod.Status.Phase = corev1.PodRunning
				_, _ = cs.CoreV1().Pods("ns").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
			}
		}
	}()
	start := time.Now()
	info, err := p.Create(ctx, roche.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("create took %v: it waited for an agent", took)
	}
	if info.State != roche.StateRunning {
		t.Fatalf("state %s, want running", info.State)
	}
	pod, err := cs.CoreV1().Pods("ns").Get(ctx, info.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeSelector["type"] != "kwok" || len(pod.Spec.NodeSelector) != 1 {
		t.Errorf("node selector %v, want type=kwok", pod.Spec.NodeSelector)
	}
	tolerated := false
	for _, tol := range pod.Spec.Tolerations {
		tolerated = tolerated || tol.Key == SimulatedNodeTaint && tol.Operator == corev1.TolerationOpExists && tol.Effect == corev1.TaintEffectNoSchedule
	}
	if !tolerated {
		t.Errorf("tolerations %v, want %s:NoSchedule tolerated", pod.Spec.Tolerations, SimulatedNodeTaint)
	}
	if err := p.Probe(ctx, info.ID); err != nil {
		t.Errorf("probe of a sandbox it made: %v", err)
	}
	if _, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "simulated") {
		t.Errorf("exec: %v, want ErrUnsupported saying the node is simulated", err)
	}
	if err := p.Destroy(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
}

func TestSimulatedRefusesWhatNeedsTheAgent(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithNamespace("ns"), WithSimulatedNodes("type=kwok"))
	if err != nil {
		t.Fatal(err)
	}
	if c := p.Capabilities(); c.Leases || c.Files || c.Processes || c.Stdin {
		t.Errorf("capabilities %+v: a simulated node offers no leases, files, processes or stdin", c)
	}
	cfg := roche.DefaultConfig()
	if _, err := p.CreateFor(context.Background(), cfg, kit.CreateOptions{Leased: true}); !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "leased") {
		t.Errorf("leased create: %v, want ErrUnsupported naming leased", err)
	}
	if n := len(cs.Actions()); n != 0 {
		t.Fatalf("a refused create made %d API calls", n)
	}
	real, err := New(WithClientset(cs, nil), WithNamespace("ns"), WithAgentImage("roche/agent:x"))
	if err != nil {
		t.Fatal(err)
	}
	if !real.Capabilities().Leases || real.Simulated() {
		t.Error("without WithSimulatedNodes the provider must keep its leases")
	}
}

func TestSimulatedBadSelector(t *testing.T) {
	for _, sel := range []string{"", "type", "=kwok", "type in (a,b)"} {
		if _, err := New(WithClientset(fake.NewClientset(), nil), WithSimulatedNodes(sel)); !errors.Is(err, roche.ErrInvalidConfig) || strings.Contains(err.Error(), "\n") {
			t.Errorf("selector %q: %v, want one line wrapping ErrInvalidConfig", sel, err)
		}
	}
}
