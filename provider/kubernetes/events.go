package kubernetes

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Watcher = (*Provider)(nil)

// watchRetry bounds the wait before a watch cut off from the API server starts again.
const watchRetry = 5 * time.Second

// Watch implements kit.Watcher with a watch of the provider's Pods (its namespace, its
// labels). The sandbox container's termination, as the kubelet reports it, is the
// sandbox's death: reason OOMKilled with exit 137 (killed by SIGKILL, and the container
// runtime saw an OOM kill in its cgroup) is sent as kit.EventOOM then kit.EventDied, any
// other as kit.EventDied with its exit code; a Pod that is being deleted (its
// deletionTimestamp set) or is gone is kit.EventRemoved. A watch cut off is made again
// from a fresh list, and what changed meanwhile is sent with Resync set.
func (p *Provider) Watch(ctx context.Context) (<-chan kit.SandboxEvent, error) {
	if p.noCluster != nil {
		return nil, p.noCluster
	}
	w := &podWatch{p: p, ch: make(chan kit.SandboxEvent, 64), seen: map[string]bool{}}
	go w.run(ctx)
	return w.ch, nil
}

// podWatch is one Watch's state: the Pods it knows, and whether their end was sent.
type podWatch struct {
	p    *Provider
	ch   chan kit.SandboxEvent
	seen map[string]bool // Pod name -> its end was sent
}

func (w *podWatch) selector() string {
	return labels.SelectorFromSet(labels.Set{LabelManaged: "true", LabelProvider: Name}).String()
}

// list reads the Pods as they are now and returns the list's resourceVersion to watch
// from. The first list only learns what is there (a Pod that ended before is the
// reconciliation's); a later one sends what the cut-off watch missed, with Resync.
func (w *podWatch) list(ctx context.Context, resync bool) (string, error) {
	lctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	pods, err := w.p.cs.CoreV1().Pods(w.p.namespace).List(lctx, metav1.ListOptions{LabelSelector: w.selector()})
	if err != nil {
		return "", w.p.apiErr("listing sandboxes to watch", err)
	}
	now := map[string]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		now[pod.Name] = true
		if !resync {
			_, ended := podEnd(pod)
			w.seen[pod.Name] = ended
			continue
		}
		w.pod(ctx, pod, true)
	}
	if resync {
		for name := range w.seen {
			if !now[name] {
				w.removed(ctx, name, true, true)
			}
		}
	}
	return pods.ResourceVersion, nil
}

// run watches until ctx ends, listing first and again after each cut (an API server
// that does not answer at the start is tried again, as after a cut).
func (w *podWatch) run(ctx context.Context) {
	defer close(w.ch)
	rv, listed := "", false
	for ctx.Err() == nil {
		if rv == "" {
			var err error
			if rv, err = w.list(ctx, listed); err != nil {
				if ctx.Err() != nil {
					return
				}
				w.p.log.Warn("cannot list the sandboxes' Pods to watch them", "err", err)
				if !sleepCtx(ctx, watchRetry) {
					return
				}
				continue
			}
			listed = true
		}
		wi, err := w.p.cs.CoreV1().Pods(w.p.namespace).Watch(ctx, metav1.ListOptions{
			LabelSelector: w.selector(), ResourceVersion: rv, AllowWatchBookmarks: true,
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.p.log.Warn("cannot watch the sandboxes' Pods", "err", err)
			rv = ""
			if !sleepCtx(ctx, watchRetry) {
				return
			}
			continue
		}
		rv = w.drain(ctx, wi)
	}
}

// drain handles one watch's events until it ends, and returns the resourceVersion to
// go on from ("" to list again).
func (w *podWatch) drain(ctx context.Context, wi watch.Interface) string {
	defer wi.Stop()
	rv := ""
	for {
		select {
		case <-ctx.Done():
			return ""
		case e, ok := <-wi.ResultChan():
			if !ok {
				return rv
			}
			pod, isPod := e.Object.(*corev1.Pod)
			switch {
			case e.Type == watch.Error || !isPod:
				// Expired resourceVersion or the like: list again.
				return ""
			case e.Type == watch.Bookmark:
			case e.Type == watch.Deleted:
				w.removed(ctx, pod.Name, false, true)
			default:
				w.pod(ctx, pod, false)
			}
			rv = pod.ResourceVersion
		}
	}
}

// pod sends the end of a Pod that ended, once.
func (w *podWatch) pod(ctx context.Context, pod *corev1.Pod, resync bool) {
	if w.seen[pod.Name] {
		return
	}
	if pod.DeletionTimestamp != nil {
		w.removed(ctx, pod.Name, resync, false)
		return
	}
	evs, ended := podEnd(pod)
	w.seen[pod.Name] = ended
	for _, ev := range evs {
		ev.Resync = resync
		w.send(ctx, ev)
	}
}

// removed sends that a Pod is being deleted (gone false) or is gone, unless its end was
// sent already.
func (w *podWatch) removed(ctx context.Context, name string, resync, gone bool) {
	done := w.seen[name]
	if gone {
		delete(w.seen, name)
	} else {
		w.seen[name] = true
	}
	if done {
		return
	}
	w.send(ctx, kit.SandboxEvent{ID: name, Kind: kit.EventRemoved, Time: time.Now(), Resync: resync,
		Evidence: "its Pod was deleted"})
}

func (w *podWatch) send(ctx context.Context, ev kit.SandboxEvent) {
	ev.Provider = Name
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	select {
	case w.ch <- ev:
	case <-ctx.Done():
	}
}

// podEnd reads a Pod's end from its sandbox container's status: the events to send, and
// whether it ended.
func podEnd(pod *corev1.Pod) ([]kit.SandboxEvent, bool) {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != containerSandbox || cs.State.Terminated == nil {
			continue
		}
		term := cs.State.Terminated
		at := term.FinishedAt.Time
		evidence := fmt.Sprintf("the kubelet's status of its container %s: terminated, reason %s, exit code %d", containerSandbox, term.Reason, term.ExitCode)
		died := kit.SandboxEvent{ID: pod.Name, Kind: kit.EventDied, Time: at, ExitCode: int(term.ExitCode), ExitKnown: true, Evidence: evidence}
		// OOMKilled stays on a container once any of its processes was OOM-killed (a
		// command's, roche-agent living on); only with SIGKILL's 137 was it PID 1's end.
		if term.Reason == "OOMKilled" && term.ExitCode == 137 {
			return []kit.SandboxEvent{{ID: pod.Name, Kind: kit.EventOOM, Time: at, Evidence: evidence}, died}, true
		}
		return []kit.SandboxEvent{died}, true
	}
	if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		// Failed before its container ran (or its status is gone): no exit to tell.
		return []kit.SandboxEvent{{ID: pod.Name, Kind: kit.EventDied, Time: time.Now(),
			Evidence: fmt.Sprintf("its Pod's phase %s, reason %q, with no status of its container", pod.Status.Phase, pod.Status.Reason)}}, true
	}
	return nil, false
}

// sleepCtx waits d or until ctx ends, and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
