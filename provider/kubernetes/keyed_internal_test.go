package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Unit tests of a keyed create's logic when the earlier create of its key failed; the
// replicas test in the cluster (deploy/kubernetes TestRochedReplicasInCluster) is where
// a replica stopped mid-create makes it happen.

func keyedPod(p *Provider, id, owner string, deleting bool) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: id, Namespace: p.namespace,
		Labels:      map[string]string{LabelManaged: "true", LabelProvider: Name},
		Annotations: map[string]string{AnnotationOwner: owner},
	}}
	if deleting {
		now := metav1.Now()
		pod.DeletionTimestamp = &now
		pod.Finalizers = []string{"test/keep"}
	}
	return pod
}

func TestJoinKeyedGone(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithAgentImage("roche/agent:x"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := keyedName("alice", "k1")
	spec := kit.Spec{Config: roche.DefaultConfig(), CreateOptions: kit.CreateOptions{Owner: "alice", IdempotencyKey: "k1"}}

	// Gone: the earlier create failed and removed its Pod.
	if _, err := p.joinKeyed(ctx, id, spec); !errors.Is(err, errKeyedGone) {
		t.Errorf("Pod gone: %v, want errKeyedGone", err)
	}
	// Going: its maker is deleting it.
	if _, err := cs.CoreV1().Pods(p.namespace).Create(ctx, keyedPod(p, id, "alice", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.joinKeyed(ctx, id, spec); !errors.Is(err, errKeyedGone) {
		t.Errorf("Pod being deleted: %v, want errKeyedGone", err)
	}
	// Another owner's Pod under the name is never joined, nor waited for.
	other := keyedName("bob", "k1")
	if _, err := cs.CoreV1().Pods(p.namespace).Create(ctx, keyedPod(p, other, "mallory", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bobs := spec
	bobs.Owner = "bob"
	if _, err := p.joinKeyed(ctx, other, bobs); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("another owner's Pod: %v, want ErrInvalidConfig", err)
	}
}

// TestAwaitRemoved: a retried keyed create waits for the Pod of the earlier create on a
// watch (no list of the policy while the Pod stands), then for its policy, and gives up
// when its context ends.
func TestAwaitRemoved(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithAgentImage("roche/agent:x"))
	if err != nil {
		t.Fatal(err)
	}
	var policyLists atomic.Int64
	policyListed := make(chan struct{}, 1)
	cs.PrependReactor("list", "networkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
		policyLists.Add(1)
		select {
		case policyListed <- struct{}{}:
		default:
		}
		return false, nil, nil
	})
	watching := make(chan struct{}, 8)
	cs.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		watching <- struct{}{}
		return false, nil, nil
	})
	watched := func() {
		t.Helper()
		select {
		case <-watching:
		case <-time.After(10 * time.Second):
			t.Fatal("the Pod was not watched")
		}
	}
	ctx := context.Background()
	id := keyedName("alice", "k2")
	if _, err := cs.CoreV1().Pods(p.namespace).Create(ctx, keyedPod(p, id, "alice", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(p.namespace).Create(ctx, networkPolicyFor(id, p.namespace), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The Pod still stands: not removed, until the deadline, and the policy is not
	// asked after meanwhile.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := p.awaitRemoved(short, id); !errors.Is(err, roche.ErrUnavailable) {
		t.Errorf("Pod still there: %v, want ErrUnavailable at the deadline", err)
	}
	if n := policyLists.Load(); n != 0 {
		t.Errorf("the policy was listed %d times while the Pod stood, want 0: the Pod is watched", n)
	}
	watched()

	done := make(chan error, 1)
	go func() { done <- p.awaitRemoved(ctx, id) }()
	watched()
	if err := cs.CoreV1().Pods(p.namespace).Delete(ctx, id, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The Pod gone, its policy still stands (its maker killed before it deleted it, the
	// garbage collector not there yet): still waiting.
	for range 2 {
		select {
		case err := <-done:
			t.Fatalf("awaitRemoved ended while the policy stood: %v", err)
		case <-policyListed:
		}
	}
	if err := cs.NetworkingV1().NetworkPolicies(p.namespace).Delete(ctx, id, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("after the policy went: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("awaitRemoved went on 10 s after everything was gone")
	}
}

func TestEnsurePolicyMakesAGoneOneAgain(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithAgentImage("roche/agent:x"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := keyedName("alice", "k3")
	if err := p.ensurePolicy(ctx, id, "uid-1"); err != nil {
		t.Fatal(err)
	}
	np, err := cs.NetworkingV1().NetworkPolicies(p.namespace).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the gone policy was not made again: %v", err)
	}
	if len(np.OwnerReferences) != 1 || np.OwnerReferences[0].UID != "uid-1" || np.OwnerReferences[0].Kind != "Pod" {
		t.Errorf("policy made again owned by %+v, want the sandbox's Pod", np.OwnerReferences)
	}
	if len(np.Spec.PolicyTypes) == 0 {
		t.Errorf("policy made again is not the deny-all one: %+v", np.Spec)
	}
	// One standing is left as it is.
	if err := p.ensurePolicy(ctx, id, "uid-2"); err != nil {
		t.Fatal(err)
	}
	np, _ = cs.NetworkingV1().NetworkPolicies(p.namespace).Get(ctx, id, metav1.GetOptions{})
	if np.OwnerReferences[0].UID != "uid-1" {
		t.Errorf("a standing policy was replaced")
	}
}

// TestLeaseErr: a replica that cannot take a sandbox's lease says why in the terms a
// client acts on. The agent's refusals keep their meaning; an agent that did not answer
// (the EOF of a relay whose agent is gone, or of a broken way to it) is the sandbox
// going when its Pod is being deleted, ended or gone, which no retry changes, and
// unavailable while its Pod runs, so that the client's Hold is tried again, through
// this replica or another.
func TestLeaseErr(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithAgentImage("roche/agent:x"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	running := keyedPod(p, "kubernetes-run", "alice", false)
	running.Status.Phase = corev1.PodRunning
	ended := keyedPod(p, "kubernetes-ended", "alice", false)
	ended.Status.Phase = corev1.PodFailed
	for _, pod := range []*corev1.Pod{running, ended, keyedPod(p, "kubernetes-going", "alice", true)} {
		if _, err := cs.CoreV1().Pods(p.namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eof := fmt.Errorf("taking the lease of sandbox x: reading the agent's reply: %w", io.EOF)
	for _, c := range []struct {
		id   string
		err  error
		want error
	}{
		{"kubernetes-run", eof, roche.ErrUnavailable},
		{"kubernetes-going", eof, roche.ErrNotFound},
		{"kubernetes-ended", eof, roche.ErrNotFound},
		{"kubernetes-none", eof, roche.ErrNotFound},
		{"kubernetes-run", &guest.Error{Code: guest.CodeNotFound, Message: "lost"}, roche.ErrNotFound},
		{"kubernetes-run", &guest.Error{Code: guest.CodeUnsupported, Message: "kept"}, roche.ErrUnsupported},
	} {
		if got := p.leaseErr(ctx, c.id, c.err); !errors.Is(got, c.want) {
			t.Errorf("%s, %v: %v, want %v", c.id, c.err, got, c.want)
		}
	}
}
