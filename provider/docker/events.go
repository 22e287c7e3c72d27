package docker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/kit"
)

var (
	_ kit.Watcher = (*Provider)(nil)
	_ kit.Prober  = (*Provider)(nil)
)

// Reconnection backoff of the event watch: short enough that an engine restart is
// noticed within seconds, bounded so a dead engine is not hammered.
const (
	watchMinBackoff = 100 * time.Millisecond
	watchMaxBackoff = 5 * time.Second
	// watchStable is how long a connection must have lasted for the backoff to start
	// over: an engine that drops every connection at once is retried ever more slowly.
	watchStable = 10 * time.Second
	// watchReplay is how far before a broken stream's end the next one asks the engine
	// to replay from (its own short memory of events), so that nothing said while the
	// break was noticed is lost; a repeat is harmless.
	watchReplay = 2 * time.Second
)

// Watch implements kit.Watcher with the Engine API's event stream, filtered to
// Roche's containers and to what ends them (die, destroy, oom). When the stream breaks
// (the engine restarted, its socket went away) it reconnects with a bounded backoff,
// saying so in the log, and resyncs: every sandbox it saw running that the engine no
// longer lists, or lists as stopped, is reported as removed or died, since an engine
// that restarted has forgotten what it said before.
func (p *Provider) Watch(ctx context.Context) (<-chan kit.SandboxEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := make(chan kit.SandboxEvent, 64)
	w := &watcher{p: p, out: out}
	// The first subscription is made before Watch returns, so that nothing the caller
	// does afterwards goes unseen; if the engine cannot be reached now, the watch keeps
	// trying in the background, as after any break.
	sub, err := w.subscribe(ctx, time.Time{})
	go w.run(ctx, sub, err)
	return out, nil
}

// watcher is one Watch: its stream, and the sandboxes it has seen running.
type watcher struct {
	p   *Provider
	out chan kit.SandboxEvent
	// known are the sandboxes last seen running (or paused), to compare with the list
	// after a reconnection.
	known map[string]bool
}

// subscription is one connection's event stream, with what the engine listed once it
// was open.
type subscription struct {
	msgs   <-chan events.Message
	errs   <-chan error
	cancel context.CancelFunc
	list   []roche.SandboxInfo
	// replayed: a reconnection, which resyncs with list.
	replayed bool
}

func (w *watcher) run(ctx context.Context, sub *subscription, err error) {
	defer close(w.out)
	backoff := watchMinBackoff
	down := false // the last attempt failed to connect: said once, not at every retry
	for {
		connected := err == nil
		began := time.Now()
		if connected {
			err = w.stream(ctx, sub)
			sub.cancel()
		}
		if ctx.Err() != nil {
			return
		}
		// Asked to replay from a moment before the break was noticed.
		since := time.Now().Add(-watchReplay)
		if connected && time.Since(began) >= watchStable {
			backoff = watchMinBackoff
		}
		switch {
		case connected:
			w.p.log.Warn("watching sandbox events: the connection to the Docker engine broke; reconnecting",
				"engine", w.p.cli.DaemonHost(), "err", err, "retry_in", backoff)
		case !down:
			w.p.log.Warn("watching sandbox events: the Docker engine cannot be reached; retrying until it can",
				"engine", w.p.cli.DaemonHost(), "err", err, "retry_in", backoff, "max_backoff", watchMaxBackoff)
		default:
			w.p.log.Debug("watching sandbox events: the Docker engine still cannot be reached", "err", err, "retry_in", backoff)
		}
		down = !connected
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, watchMaxBackoff)
		sub, err = w.subscribe(ctx, since)
	}
}

// subscribe opens the engine's event stream (replaying from since, when set) and then
// lists the sandboxes, so that nothing falls between the two.
func (w *watcher) subscribe(ctx context.Context, since time.Time) (*subscription, error) {
	// A ping agrees the API version first, within its own bound, so that the stream
	// below is not what waits on an engine that does not answer.
	if err := w.p.Ping(ctx); err != nil {
		return nil, err
	}
	args := filters.NewArgs(
		filters.Arg("type", string(events.ContainerEventType)),
		filters.Arg("label", LabelManaged+"=true"),
		filters.Arg("label", LabelProvider+"=docker"),
		filters.Arg("event", string(events.ActionStart)),
		filters.Arg("event", string(events.ActionDie)),
		filters.Arg("event", string(events.ActionDestroy)),
		filters.Arg("event", string(events.ActionOOM)),
	)
	opts := events.ListOptions{Filters: args}
	if !since.IsZero() {
		opts.Since = unixNano(since)
	}
	sctx, cancel := context.WithCancel(ctx)
	// Events returns once the engine has answered the subscription, or failed; one that
	// never answers is given up on like any call needing one quick answer.
	hung := time.AfterFunc(engine.ControlTimeout, cancel)
	msgs, errs := w.p.cli.Events(sctx, opts)
	if !hung.Stop() {
		cancel()
		return nil, &engine.NotAnsweringError{Engine: w.p.engine, Op: "subscribing to sandbox events", After: engine.ControlTimeout}
	}
	select {
	case err := <-errs:
		cancel()
		return nil, w.p.engineErr("subscribing to sandbox events", err)
	default:
	}
	list, err := w.p.List(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return &subscription{msgs: msgs, errs: errs, cancel: cancel, list: list, replayed: !since.IsZero()}, nil
}

// stream resyncs with the subscription's list and passes events on until the stream
// breaks or ctx ends.
func (w *watcher) stream(ctx context.Context, sub *subscription) error {
	if err := w.resync(ctx, sub.list, sub.replayed); err != nil {
		return err
	}
	for {
		select {
		case m := <-sub.msgs:
			if err := w.handle(ctx, m); err != nil {
				return err
			}
		case err := <-sub.errs:
			if err == nil {
				err = errors.New("the event stream ended")
			}
			return w.p.engineErr("watching sandbox events", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// resync makes list the sandboxes known to run and, after a reconnection, reports
// every one known before that has since died or gone.
func (w *watcher) resync(ctx context.Context, list []roche.SandboxInfo, reconnected bool) error {
	now := time.Now()
	listed := make(map[string]roche.SandboxState, len(list))
	live := make(map[string]bool, len(list))
	for _, sb := range list {
		listed[sb.ID] = sb.State
		if sb.State == roche.StateRunning || sb.State == roche.StatePaused {
			live[sb.ID] = true
		}
	}
	var ended []kit.SandboxEvent
	if reconnected {
		for id := range w.known {
			if live[id] {
				continue
			}
			kind := kit.EventDied
			if _, ok := listed[id]; !ok {
				kind = kit.EventRemoved
			}
			ended = append(ended, kit.SandboxEvent{Provider: w.p.Name(), ID: id, Kind: kind, Time: now, Resync: true})
		}
		w.p.log.Info("watching sandbox events again", "engine", w.p.cli.DaemonHost(), "ended_meanwhile", len(ended))
	}
	w.known = live
	for _, ev := range ended {
		if err := w.send(ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

// handle turns one engine event into a sandbox event.
func (w *watcher) handle(ctx context.Context, m events.Message) error {
	id := m.Actor.ID
	if id == "" {
		return nil
	}
	ev := kit.SandboxEvent{Provider: w.p.Name(), ID: id, Time: time.Unix(0, m.TimeNano)}
	switch m.Action {
	case events.ActionStart:
		w.known[id] = true
		return nil
	case events.ActionDie:
		delete(w.known, id)
		ev.Kind = kit.EventDied
		if code, err := strconv.Atoi(m.Actor.Attributes["exitCode"]); err == nil {
			ev.ExitCode, ev.ExitKnown = code, true
		}
		// The agent's socket is gone with it: the next call must ask the engine.
		w.p.forget(id)
	case events.ActionDestroy:
		delete(w.known, id)
		ev.Kind = kit.EventRemoved
		w.p.forget(id)
		// Its socket directory goes with it: the engine removes a container that ended
		// (auto-remove) without anyone calling Destroy. The event carries the labels.
		// A container a create (in any process) undid to draw another uid carried the
		// directory the next one gets: that create has not settled it yet.
		if dir := m.Actor.Attributes[LabelAgentDir]; !startPending(dir) {
			w.p.removeAgentDir(dir)
		}
	case events.ActionOOM:
		ev.Kind = kit.EventOOM
	default:
		return nil
	}
	return w.send(ctx, ev)
}

func (w *watcher) send(ctx context.Context, ev kit.SandboxEvent) error {
	select {
	case w.out <- ev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Probe implements kit.Prober. It connects to the sandbox's roche-agent, which needs
// no engine round trip and does not even wake the agent: the kernel completes a
// connection to a listening unix socket on its own, and refuses it once the agent, PID 1
// of the sandbox, has died. (A health call, which the agent must answer, cost a pool hit
// 2-3 ms more here, waking an agent idle for seconds; this costs tens of microseconds.)
// A sandbox on the exec-API transport is inspected instead.
func (p *Provider) Probe(ctx context.Context, id string) error {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return err
	}
	if s.agent == nil {
		c, _, err := p.inspect(ctx, s.id)
		if err != nil {
			return err
		}
		if c.State == nil || !c.State.Running || c.State.Paused {
			status := "gone"
			if c.State != nil {
				status = c.State.Status
			}
			return fmt.Errorf("%w: sandbox %s is not running (%s)", roche.ErrUnavailable, s.id, status)
		}
		return nil
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", s.agent.Socket())
	if err != nil {
		// The next call asks the engine again rather than trusting the cached agent.
		p.forget(s.id)
		return fmt.Errorf("%w: the roche-agent of sandbox %s is not there: %v", roche.ErrUnavailable, s.id, err)
	}
	// Closed unused: the agent reads end-of-file as its first frame and lets it go.
	return c.Close()
}
