// Package engine bounds the calls a provider makes to the engine beneath it (the Docker
// engine, a VM's hypervisor) by a deadline derived from what the call is for, and turns
// a deadline that passes into one line that names the engine and says it is not
// answering. An engine can hang rather than fail (dockerd frozen, a socket that accepts
// and never answers): without a deadline every caller hangs with it.
package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/defaults"
)

// Deadlines, by what a call is for.
const (
	// DefaultTimeout bounds a create and everything it waits for (providers make it
	// configurable, e.g. docker.WithEngineTimeout).
	DefaultTimeout = defaults.EngineTimeout
	// ControlTimeout bounds a call that needs one quick answer: list, inspect, destroy,
	// pause, a health check.
	ControlTimeout = 10 * time.Second
	// headerTimeout bounds the wait for any Engine API response to begin, as a net under
	// calls no operation bounds more tightly; it is long because some calls (a commit,
	// a removal of a large container) answer only when done.
	headerTimeout = 2 * time.Minute
)

// Engine names an engine for messages.
type Engine struct {
	// Name is what to call it: "the Docker engine".
	Name string
	// Addr is where it is reached: "unix:///var/run/docker.sock".
	Addr string
	// Hint says what to do when it does not answer.
	Hint string
	// Ready, when set, is waited for (as long as the caller's deadline allows) before a
	// bounded call starts: a Negotiation's Wait. An error that is a NotAnsweringError
	// ends the call at once.
	Ready func(context.Context) error
}

// NotAnsweringError says an engine did not answer an operation within its deadline. It
// is roche.ErrUnavailable (the backend cannot be used now, which the API reports) and
// roche.ErrTimeout (it is there, but hangs, unlike one that refuses connections).
type NotAnsweringError struct {
	Engine Engine
	Op     string // "listing sandboxes"
	After  time.Duration
}

func (e *NotAnsweringError) Error() string {
	return fmt.Sprintf("%s at %s is not answering: %s got no reply within %s; %s",
		e.Engine.Name, e.Engine.Addr, e.Op, e.After, e.Engine.Hint)
}

// Is makes the error roche.ErrUnavailable and roche.ErrTimeout to errors.Is.
func (e *NotAnsweringError) Is(target error) bool {
	return target == roche.ErrUnavailable || target == roche.ErrTimeout
}

// Bound returns ctx limited to d for op, and done, to be deferred with the operation's
// error: it releases the context and, when a deadline passed before the operation ended
// (this one, or an earlier one the caller set), replaces the error (whatever shape the
// engine's client gave it) with the NotAnsweringError. A caller's own cancellation (a
// signal) is left as it is.
func (e Engine) Bound(ctx context.Context, op string, d time.Duration) (context.Context, func(*error)) {
	start := time.Now()
	na := &NotAnsweringError{Engine: e, Op: op, After: d}
	deadline := start.Add(d)
	ctx, cancelDeadline := context.WithDeadlineCause(ctx, deadline, na)
	ctx, cancel := context.WithCancelCause(ctx)
	if e.Ready != nil {
		var hung *NotAnsweringError
		if err := e.Ready(ctx); errors.As(err, &hung) {
			cancel(hung)
		}
	}
	return ctx, func(err *error) {
		defer cancelDeadline()
		defer cancel(nil)
		if err == nil || *err == nil {
			return
		}
		var cause *NotAnsweringError
		switch {
		case errors.As(context.Cause(ctx), &cause):
			// This bound's deadline, or an enclosing one's.
			*err = cause
		case errors.Is(context.Cause(ctx), context.DeadlineExceeded):
			// The caller's own, earlier deadline: the engine did not answer within it.
			*err = &NotAnsweringError{Engine: e, Op: op, After: time.Since(start).Round(100 * time.Millisecond)}
		case ctx.Err() == nil && !time.Now().Before(deadline):
			// A socket deadline set from ctx fired a moment before ctx itself.
			*err = na
		}
	}
}

// Call runs f, which may stop watching ctx once it has started (Docker's hijacked
// connections do), and returns when f does or when ctx ends, whichever is first. A
// result f returns after that is handed to discard, so nothing it holds leaks.
func Call[T any](ctx context.Context, f func() (T, error), discard func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.err == nil && discard != nil {
				discard(r.v)
			}
		}()
		var zero T
		return zero, context.Cause(ctx)
	}
}

// DockerClient is an Engine API client configured from the environment (DOCKER_HOST
// and friends) whose every request gives up when no response has begun within
// headerTimeout, so a call no operation bounds cannot hang for ever.
func DockerClient() (*client.Client, error) {
	return client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation(), func(c *client.Client) error {
		// HTTPClient returns a copy of the client, sharing its transport.
		if tr, ok := c.HTTPClient().Transport.(*http.Transport); ok {
			tr.ResponseHeaderTimeout = headerTimeout
		}
		return nil
	})
}

// Negotiation agrees the Engine API version with a Docker engine once, before the first
// bounded call, so that no call waits on another's. The Docker client negotiates on the
// first request under a lock that does not watch contexts, pinging with the context of
// whichever call came first: against an engine that does not answer, every other call
// waited for that one's deadline (a 2 s create behind a 10 s list took 10 s).
// Negotiation pings from a goroutine of its own, bounded by ControlTimeout, and each
// caller waits for it only as long as its own context allows.
type Negotiation struct {
	cli  *client.Client
	eng  Engine
	done atomic.Bool

	mu      sync.Mutex
	current *attempt // the ping under way, or nil
}

// attempt is one ping; err is set before done is closed.
type attempt struct {
	done chan struct{}
	err  error
}

// NewNegotiation returns the negotiation for c, which eng names in errors.
func NewNegotiation(c *client.Client, eng Engine) *Negotiation {
	return &Negotiation{cli: c, eng: eng}
}

// Wait returns nil once the version is agreed (at once, after the first time), ctx's
// error when it ends first, a NotAnsweringError when the engine did not answer a ping
// within ControlTimeout, or the ping's error (an engine that refuses connections: the
// caller's own call then reports it as it would have).
func (n *Negotiation) Wait(ctx context.Context) error {
	if n.done.Load() {
		return nil
	}
	n.mu.Lock()
	a := n.current
	if a == nil {
		a = &attempt{done: make(chan struct{})}
		n.current = a
		go n.ping(a)
	}
	n.mu.Unlock()
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (n *Negotiation) ping(a *attempt) {
	ctx, cancel := context.WithTimeout(context.Background(), ControlTimeout)
	defer cancel()
	ping, err := n.cli.Ping(ctx)
	switch {
	case err == nil:
		n.cli.NegotiateAPIVersionPing(ping)
		n.done.Store(true)
	case ctx.Err() != nil:
		err = &NotAnsweringError{Engine: n.eng, Op: "agreeing the API version", After: ControlTimeout}
	}
	a.err = err
	n.mu.Lock()
	n.current = nil // the next caller pings again
	n.mu.Unlock()
	close(a.done)
}
