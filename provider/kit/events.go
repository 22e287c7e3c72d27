package kit

import (
	"context"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
)

// Watcher is a provider that can tell, as it happens, that one of its sandboxes ended
// behind its callers' back: killed, stopped by its engine (an engine restart stops
// every container), out of memory, or removed. A daemon that tracks sandboxes uses it
// to forget a dead one at once instead of at its next reconciliation, and never to
// hand a dead one out.
type Watcher interface {
	// Watch streams the events of this provider's sandboxes until ctx ends, then closes
	// the channel. A connection to the engine that breaks is made again (with a bounded
	// backoff); what was missed meanwhile is found by comparing with the provider's list
	// and sent as events with Resync set. An error means nothing can be watched at all.
	Watch(ctx context.Context) (<-chan SandboxEvent, error)
}

// WatchLister is a Watcher that keeps, from its running watch, what its sandboxes are:
// a daemon's periodic reconciliation reads that instead of listing them again, which on
// a cluster costs the API server a list of every sandbox each time.
type WatchLister interface {
	Watcher
	// Watched returns the sandboxes as the running watch last saw them, described as
	// List describes them; ok is false while no watch runs or one that broke has not
	// caught up. It may lag the engine by the events on their way: a sandbox made or
	// removed a moment ago may not show yet, except that one the provider itself
	// removed is left out at once.
	Watched() (list []roche.SandboxInfo, ok bool)
}

// SandboxEventKind says what happened to a sandbox.
type SandboxEventKind string

const (
	// EventDied: the sandbox's main process ended (killed, stopped by its engine, or its
	// lifetime over); the sandbox runs nothing any more.
	EventDied SandboxEventKind = "died"
	// EventRemoved: the sandbox no longer exists.
	EventRemoved SandboxEventKind = "removed"
	// EventOOM: a process in the sandbox was killed for exceeding the memory limit. The
	// sandbox itself may live on (roche-agent makes commands the OOM killer's first
	// choice); if it does not, EventDied follows.
	EventOOM SandboxEventKind = "oom"
)

// SandboxEvent is something that happened to one sandbox.
type SandboxEvent struct {
	Provider string           `json:"provider"`
	ID       string           `json:"id"`
	Kind     SandboxEventKind `json:"kind"`
	// ExitCode is the main process's exit status of an EventDied, when ExitKnown.
	ExitCode  int  `json:"exit_code,omitempty"`
	ExitKnown bool `json:"exit_known,omitempty"`
	// Evidence, when set, is what the engine said, in its words (a Pod's container
	// status: "terminated, reason OOMKilled, exit code 137").
	Evidence string `json:"evidence,omitempty"`
	// Time is when the engine says it happened, or, with Resync, when it was found.
	Time time.Time `json:"time"`
	// Resync: not seen as it happened (the watch was cut off from the engine then) but
	// found afterwards by comparing with the provider's list.
	Resync bool `json:"resync,omitempty"`
}

// Ended reports whether the sandbox is finished: it died or was removed.
func (e SandboxEvent) Ended() bool { return e.Kind == EventDied || e.Kind == EventRemoved }

// Reason says what happened in a few words, for logs and error messages: "its container
// died (exit 137)", "it was removed".
func (e SandboxEvent) Reason() string {
	var s string
	switch e.Kind {
	case EventDied:
		s = "its main process ended (killed, stopped by its engine, or its lifetime over)"
		if e.ExitKnown {
			s = fmt.Sprintf("its main process ended with status %d (killed, stopped by its engine, or its lifetime over)", e.ExitCode)
		}
	case EventRemoved:
		s = "it was removed"
	case EventOOM:
		s = "a process in it was killed for exceeding the memory limit"
	default:
		s = string(e.Kind)
	}
	if e.Resync {
		s += ", found after the connection to its engine was restored"
	}
	return s
}

// Prober is a provider that can tell cheaply whether a sandbox is alive and answering,
// without the round trip to its engine that Inspect may need (the Docker provider asks
// the sandbox's roche-agent). A pool probes a sandbox before handing it out.
type Prober interface {
	// Probe returns nil when the sandbox runs and answers, else why not. It is bounded by
	// ctx and should take well under a millisecond for a sandbox that answers.
	Probe(ctx context.Context, id string) error
}

// Claimer is implemented by providers that keep, with each sandbox, whose it is and
// when it ends where others can read them (a Pod's labels and annotations; a Docker
// sandbox's agent directory on the host; an oci, wasm or microVM sandbox's record on
// disk): a sandbox handed out from a warm pool is claimed for its new holder, so that
// whoever lists the provider later (a roched restarted without its state, a gc, an
// operator) sees the holder and the end the client got, not the pool's. List and
// Inspect report a claimed sandbox's Owner and ExpiresAt from its claim.
type Claimer interface {
	// Claim records that sandbox id is now c.Owner's and ends at c.Expires, never later
	// than the end it was made with, with what its holder applies to each command.
	Claim(ctx context.Context, id string, c Claim) error
	// Claimed returns the claim recorded for sandbox id, ok false when it has none.
	Claimed(ctx context.Context, id string) (c Claim, ok bool, err error)
}

// Claim is what a sandbox handed out from a warm pool is to its holder. Env and Workdir
// are what the holder's create asked for, which the pool could not give the sandbox when
// it made it: whoever serves the sandbox (roched) applies them to each command.
type Claim struct {
	Owner   string            `json:"owner"`
	Expires time.Time         `json:"expires"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
}
