package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/roche-sandbox/roche"
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
// from a fresh list, and what changed meanwhile is sent with Resync set. What the
// latest Watch sees of the Pods is what Watched returns.
func (p *Provider) Watch(ctx context.Context) (<-chan kit.SandboxEvent, error) {
	if p.noCluster != nil {
		return nil, p.noCluster
	}
	w := &podWatch{p: p, ch: make(chan kit.SandboxEvent, 64), seen: map[string]bool{}, view: newWatchedPods()}
	p.watched.Store(w.view)
	go w.run(ctx)
	return w.ch, nil
}

// podWatch is one Watch's state: the Pods it knows, whether their end was sent, and
// what they are (Watched).
type podWatch struct {
	p    *Provider
	ch   chan kit.SandboxEvent
	seen map[string]bool // Pod name -> its end was sent
	view *watchedPods
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
	w.view.listed(w.p, pods.Items)
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
	defer func() {
		w.view.unsynced()
		w.p.watched.CompareAndSwap(w.view, nil)
	}()
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
			w.view.unsynced()
			if !sleepCtx(ctx, watchRetry) {
				return
			}
			continue
		}
		if rv = w.drain(ctx, wi); rv == "" {
			w.view.unsynced()
		}
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
				w.view.deleted(pod.Name)
				w.removed(ctx, pod.Name, false, true)
			default:
				w.view.changed(w.p, pod)
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
		// On gVisor the host's OOM killer never picks a command (they are gVisor's
		// tasks): it kills gVisor's kernel, which ends the whole sandbox, and gVisor's
		// shim reports the container's exit as 128, not 137.
		gvisorOOM := term.Reason == "OOMKilled" && pod.Spec.RuntimeClassName != nil && gvisorClass(*pod.Spec.RuntimeClassName)
		if term.Reason == "OOMKilled" && term.ExitCode == 137 || gvisorOOM {
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

// endWait bounds how long a connection to a sandbox's agent that broke waits for the
// kubelet to report the sandbox's end: its Pod reads Running for a moment after its
// container died (the kubelet sees it at its next look at the runtime, about a second,
// then writes the Pod's status), longest when the whole Pod went at once (a gVisor
// sandbox past its memory limit, whose kernel the host's OOM killer ends).
const endWait = 20 * time.Second

// awaitEnd reports whether sandbox id has ended, after its agent's connection broke,
// and why when its Pod tells (nil when it does not, or it is gone): at once when its
// Pod is gone, being deleted or ended, else once the kubelet says so, watching the Pod
// for up to endWait. A Pod that still runs then has not ended: the connection broke
// for another reason.
func (p *Provider) awaitEnd(id string) (bool, *roche.EndReason) {
	ctx, cancel := context.WithTimeout(context.Background(), endWait)
	defer cancel()
	for {
		pod, err := p.get(ctx, id)
		if errors.Is(err, roche.ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, nil
		}
		if podEnded(pod) {
			return true, podEndReason(pod)
		}
		wi, err := p.cs.CoreV1().Pods(p.namespace).Watch(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("metadata.name", id).String(), ResourceVersion: pod.ResourceVersion,
		})
		if err != nil {
			return false, nil
		}
		ended, why, again := awaitEndOn(ctx, wi)
		wi.Stop()
		if !again {
			return ended, why
		}
	}
}

// awaitEndOn reads one watch of a sandbox's Pod until the Pod ends or goes, or the watch
// or ctx does (again: the watch ended early, watch again).
func awaitEndOn(ctx context.Context, wi watch.Interface) (ended bool, why *roche.EndReason, again bool) {
	for {
		select {
		case <-ctx.Done():
			return false, nil, false
		case e, ok := <-wi.ResultChan():
			if !ok {
				return false, nil, ctx.Err() == nil
			}
			pod, isPod := e.Object.(*corev1.Pod)
			switch {
			case e.Type == watch.Error || !isPod:
				return false, nil, ctx.Err() == nil
			case e.Type == watch.Deleted:
				return true, podEndReason(pod), false
			case podEnded(pod):
				return true, podEndReason(pod), false
			}
		}
	}
}

// podEnded says whether a sandbox's Pod ended: its container terminated, its phase past
// Running, or its deletion begun.
func podEnded(pod *corev1.Pod) bool {
	_, ended := podEnd(pod)
	return ended || stateOf(pod) != roche.StateRunning
}

// podEndReason reads why a sandbox's Pod ended from its sandbox container's status, as
// the watch does (podEnd): OOM (reason OOMKilled, exit 137), its lifetime (ended at or
// past its expiry), else roche-agent's exit, with that status as the evidence; nil when
// the status does not tell.
func podEndReason(pod *corev1.Pod) *roche.EndReason {
	evs, ended := podEnd(pod)
	if !ended || len(evs) == 0 {
		return nil
	}
	died := evs[len(evs)-1]
	e := &roche.EndReason{At: died.Time, Evidence: died.Evidence, ExitCode: died.ExitCode, ExitKnown: died.ExitKnown}
	expires := expiresOf(pod.Labels)
	switch {
	case evs[0].Kind == kit.EventOOM:
		e.Kind, e.Detail = roche.EndOOM, "killed for exceeding its memory limit"
	case !died.ExitKnown:
		return nil // no status of its container: nothing says why
	case !expires.IsZero() && !died.Time.Before(expires.Add(-time.Second)):
		e.Kind, e.Detail = roche.EndLifetime, "its lifetime ended at "+expires.Local().Format(time.TimeOnly)
	default:
		e.Kind, e.Detail = roche.EndAgentExited, fmt.Sprintf("its main process (roche-agent) exited with status %d", died.ExitCode)
	}
	return e
}
