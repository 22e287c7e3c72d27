package oci

import (
	"context"
	"time"

	"github.com/roche-sandbox/roche/provider/kit"
)

// Watch streams the events of the sandboxes whose PID 1 this process watches
// (exit_linux.go): kit.EventOOM when the sandbox cgroup's OOM-kill counter grows (read
// every oomPoll while watched, once more at the exit, and before a teardown removes the
// cgroup), then kit.EventDied when its PID 1, roche-agent, exits, before the sandbox is
// torn down. The runtime keeps no exit status, so none is given. Sandboxes made or found by this process are watched; none
// is missed by a lost connection, so there is no resync.
func (p *Provider) Watch(ctx context.Context) (<-chan kit.SandboxEvent, error) {
	return p.events.Watch(ctx)
}

// oomPoll is how often a watched sandbox's OOM-kill counter is read: an OOM kill that
// ends the sandbox is then seen within it of the exit, well inside the daemon's 2 s
// between an OOM event and a death that counts as its.
const oomPoll = 500 * time.Millisecond

// watched reports whether anyone watches events.
func (p *Provider) watched() bool { return p.events.Watched() }

// emit tells every watcher of ev; a watcher whose channel is full misses it (the
// daemon's reconciliation still finds the sandbox gone).
func (p *Provider) emit(ev kit.SandboxEvent) {
	ev.Provider = p.Name()
	if p.events.Send(ev) > 0 {
		p.log.Warn("a watcher of sandbox events is behind: dropping an event", "id", ev.ID, "kind", ev.Kind)
	}
}
