package kubernetes_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// lineSignal is an io.Writer for a logger that closes seen at the first line holding
// want.
type lineSignal struct {
	want string
	once sync.Once
	seen chan struct{}
}

func (w *lineSignal) Write(b []byte) (int, error) {
	if strings.Contains(string(b), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(b), nil
}

// TestKeyedRetryAwaitsEarlierRemoval, on the test cluster: a keyed create whose key's Pod
// is being deleted (held by a finalizer, as a slow kubelet or a maker's removal under
// way would) waits for it (awaitRemoved: a watch of the Pod, then its NetworkPolicy,
// which the garbage collector removes with the Pod), and answers only once it is gone,
// with a sandbox made afresh under the same name.
func TestKeyedRetryAwaitsEarlierRemoval(t *testing.T) {
	waiting := &lineSignal{want: "waiting for the earlier create of this idempotency key", seen: make(chan struct{})}
	p := newProvider(t, kubernetes.WithLogger(slog.New(slog.NewTextHandler(waiting, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	cs := clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	keyed := kit.CreateOptions{Owner: "alice", IdempotencyKey: "retry-1"}

	first, err := p.CreateFor(ctx, baseConfig(), keyed)
	if err != nil {
		t.Fatal(err)
	}
	pods := cs.CoreV1().Pods(p.Namespace())
	held := []byte(`{"metadata":{"finalizers":["roche.test/hold"]}}`)
	let := []byte(`{"metadata":{"finalizers":null}}`)
	pod, err := pods.Patch(ctx, first.ID, types.MergePatchType, held, metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pods.Patch(context.Background(), first.ID, types.MergePatchType, let, metav1.PatchOptions{}) })
	if err := pods.Delete(ctx, first.ID, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}

	type result struct {
		info roche.SandboxInfo
		err  error
	}
	again := make(chan result, 1)
	go func() {
		info, err := p.CreateFor(ctx, baseConfig(), keyed)
		again <- result{info, err}
	}()
	select {
	case <-waiting.seen:
	case r := <-again:
		t.Fatalf("the retried create answered while the earlier Pod was being deleted: %+v %v", r.info, r.err)
	case <-ctx.Done():
		t.Fatal("the retried create never waited for the earlier Pod")
	}
	select {
	case r := <-again:
		t.Fatalf("the retried create answered while the earlier Pod was still held: %+v %v", r.info, r.err)
	default:
	}
	if _, err := pods.Patch(ctx, first.ID, types.MergePatchType, let, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-again:
	case <-ctx.Done():
		t.Fatal("the retried create went on after the earlier Pod was gone")
	}
	if r.err != nil {
		t.Fatalf("the retried create, once the earlier Pod was gone: %v", r.err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(context.Background(), r.info.ID); err != nil {
			t.Errorf("Destroy %s: %v", r.info.ID, err)
		}
	})
	if r.info.ID != first.ID {
		t.Errorf("the retried create made %s, want the key's name %s", r.info.ID, first.ID)
	}
	now, err := pods.Get(ctx, r.info.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID == pod.UID || now.DeletionTimestamp != nil {
		t.Errorf("the retried create answered with the earlier Pod (uid %s, deleting %v), want one made afresh", now.UID, now.DeletionTimestamp != nil)
	}
	if got := py(t, p, r.info.ID, "print('afresh')"); got != "afresh" {
		t.Errorf("the sandbox made afresh printed %q", got)
	}
}
