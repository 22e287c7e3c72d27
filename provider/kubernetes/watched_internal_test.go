package kubernetes

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestWatchedKeepsUpWithTheWatch: Watched holds what the running Watch saw, from its
// list and then its events, as List describes the Pods; a Pod this provider deleted is
// left out at once, before its deletion comes through the watch; with no Watch running
// it says so.
func TestWatchedKeepsUpWithTheWatch(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithNamespace("ns"), WithAgentImage("roche/agent:x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Watched(); ok {
		t.Fatal("Watched ok with no Watch running")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sandboxPod := func(name, owner string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ns", Labels: map[string]string{LabelManaged: "true", LabelProvider: Name},
			Annotations: map[string]string{AnnotationOwner: owner},
		}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, sandboxPod("kubernetes-a", "x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The fake's watch is the tracker's, made here so that the test knows when it runs.
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	watching := make(chan struct{})
	cs.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		w, err := cs.Tracker().Watch(gvr, "ns")
		close(watching)
		return true, w, err
	})
	events, err := p.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	<-watching
	ids := func() []string {
		list, ok := p.Watched()
		if !ok {
			return nil
		}
		var out []string
		for _, sb := range list {
			out = append(out, sb.ID+"/"+sb.Owner)
		}
		slices.Sort(out)
		return out
	}
	want := func(what string, w ...string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, what, func() bool { return slices.Equal(ids(), w) })
	}
	want("the listed Pod", "kubernetes-a/x")
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, sandboxPod("kubernetes-b", "x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a Pod made", "kubernetes-a/x", "kubernetes-b/x")
	if _, err := cs.CoreV1().Pods("ns").Update(ctx, sandboxPod("kubernetes-b", "y"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a Pod changed", "kubernetes-a/x", "kubernetes-b/y")
	if list, _ := p.Watched(); len(list) != 2 || list[0].State != roche.StateRunning {
		t.Errorf("watched %+v, want both running", list)
	}
	// Deleted by someone else: gone once the watch says so.
	if err := cs.CoreV1().Pods("ns").Delete(ctx, "kubernetes-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("a Pod deleted elsewhere", "kubernetes-b/y")
	// Deleted here: gone at once. The watch is held up meanwhile, as by a slow link.
	view := p.watched.Load()
	view.mu.Lock()
	view.pods["kubernetes-c"] = roche.SandboxInfo{ID: "kubernetes-c", Owner: "x"}
	view.mu.Unlock()
	if err := p.remove(ctx, "kubernetes-c"); err != nil {
		t.Fatal(err)
	}
	if got := ids(); !slices.Equal(got, []string{"kubernetes-b/y"}) {
		t.Errorf("after this provider deleted kubernetes-c: %v", got)
	}
	cancel()
	for range events {
	}
	if _, ok := p.Watched(); ok {
		t.Error("Watched ok once the Watch ended")
	}
}
