package kubernetes

import (
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.WatchLister = (*Provider)(nil)

// watchedPods is what the running Pod watch (events.go) last saw of the provider's
// sandboxes, kept from its list and its events, so that a reconciliation reads it
// instead of listing every sandbox's Pod again: a list of 1,000 Pods costs the API
// server and roched tens of ms of CPU each, every 3 s on every replica of a group.
type watchedPods struct {
	mu sync.Mutex
	// synced: the watch listed since it last started and is watching on from that list,
	// so that pods misses no change but those on their way.
	synced bool
	pods   map[string]roche.SandboxInfo
	// removed are the Pods this provider deleted whose deletion the watch has not
	// brought yet: left out at once, or a reconciliation would take a sandbox its
	// replica just destroyed for one another replica made.
	removed map[string]bool
}

func newWatchedPods() *watchedPods {
	return &watchedPods{pods: map[string]roche.SandboxInfo{}, removed: map[string]bool{}}
}

// listed starts again from a list of every Pod.
func (w *watchedPods) listed(p *Provider, pods []corev1.Pod) {
	now := make(map[string]roche.SandboxInfo, len(pods))
	for i := range pods {
		now[pods[i].Name] = p.info(&pods[i])
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pods, w.synced = now, true
	for name := range w.removed {
		if _, ok := now[name]; !ok {
			delete(w.removed, name)
		}
	}
}

// unsynced says the watch broke: what it holds may miss changes until it lists again.
func (w *watchedPods) unsynced() {
	w.mu.Lock()
	w.synced = false
	w.mu.Unlock()
}

// changed takes in a Pod the watch says was added or changed.
func (w *watchedPods) changed(p *Provider, pod *corev1.Pod) {
	info := p.info(pod)
	w.mu.Lock()
	w.pods[pod.Name] = info
	w.mu.Unlock()
}

// deleted drops a Pod the watch says is gone.
func (w *watchedPods) deleted(name string) {
	w.mu.Lock()
	delete(w.pods, name)
	delete(w.removed, name)
	w.mu.Unlock()
}

// remove leaves out a Pod this provider deleted, until the watch says it is gone.
func (w *watchedPods) remove(name string) {
	w.mu.Lock()
	if _, ok := w.pods[name]; ok {
		w.removed[name] = true
	}
	w.mu.Unlock()
}

// list returns the sandboxes, ok false when the watch is not synced.
func (w *watchedPods) list() ([]roche.SandboxInfo, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return nil, false
	}
	out := make([]roche.SandboxInfo, 0, len(w.pods))
	for name, info := range w.pods {
		if !w.removed[name] {
			out = append(out, info)
		}
	}
	return out, true
}

// Watched implements kit.WatchLister: the sandboxes as the running Watch last saw them,
// as List describes them. ok is false while no Watch runs, and while one that broke has
// not listed again.
func (p *Provider) Watched() ([]roche.SandboxInfo, bool) {
	w := p.watched.Load()
	if w == nil {
		return nil, false
	}
	return w.list()
}

// watchRemoved tells the running Watch's view that this provider deleted a Pod.
func (p *Provider) watchRemoved(id string) {
	if w := p.watched.Load(); w != nil {
		w.remove(id)
	}
}
