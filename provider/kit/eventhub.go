package kit

import (
	"context"
	"sync"
)

// EventHub fans a provider's sandbox events out to the callers of its Watch, for a
// provider that learns of its sandboxes' ends in its own process (oci's PID 1 watch,
// the vm provider's supervisor watch) rather than from an engine's event stream. The
// zero value is ready to use.
type EventHub struct {
	mu       sync.Mutex
	watchers map[chan SandboxEvent]struct{}
}

// Watch implements Watcher's Watch: a channel told of every event sent until ctx ends,
// then closed. Nothing is missed by a lost connection, so none is ever Resync.
func (h *EventHub) Watch(ctx context.Context) (<-chan SandboxEvent, error) {
	ch := make(chan SandboxEvent, 64)
	h.mu.Lock()
	if h.watchers == nil {
		h.watchers = map[chan SandboxEvent]struct{}{}
	}
	h.watchers[ch] = struct{}{}
	h.mu.Unlock()
	go func() {
		<-ctx.Done()
		h.mu.Lock()
		delete(h.watchers, ch)
		close(ch)
		h.mu.Unlock()
	}()
	return ch, nil
}

// Watched reports whether anyone watches.
func (h *EventHub) Watched() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.watchers) > 0
}

// Send tells every watcher of ev and returns how many missed it: a watcher whose
// channel is full is not waited for (a daemon's reconciliation still finds the sandbox
// gone).
func (h *EventHub) Send(ev SandboxEvent) (missed int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.watchers {
		select {
		case ch <- ev:
		default:
			missed++
		}
	}
	return missed
}
