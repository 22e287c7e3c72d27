package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
)

// An engine can hang instead of failing (dockerd frozen, a socket that accepts and never
// answers). The daemon asks each provider's engine, with a short deadline, whether it
// answers; while one does not, /healthz and roche_engine_up say so and creates for that
// provider are refused at once, naming the engine, instead of each waiting out its own
// deadline. Going down and coming back are logged.

// pinger is a provider whose engine can be asked whether it answers (docker.Provider).
type pinger interface {
	Ping(ctx context.Context) error
}

// engineCheckTimeout bounds one check: an engine that answers does so in milliseconds.
const engineCheckTimeout = 5 * time.Second

// engineState is what the last check of one engine found.
type engineState struct {
	up    bool
	since time.Time // when it last changed
	err   error     // why it is down
}

// engines holds the state of every watched engine, by provider name.
type engines struct {
	mu    sync.Mutex
	state map[string]*engineState
}

func newEngines(providers map[string]roche.Provider) *engines {
	e := &engines{state: map[string]*engineState{}}
	now := time.Now()
	for name, p := range providers {
		if _, ok := p.(pinger); ok {
			// Assumed up until a check says otherwise, so a start-up never refuses.
			e.state[name] = &engineState{up: true, since: now}
		}
	}
	return e
}

// set records a check's result and reports whether it changed the state.
func (e *engines) set(name string, err error) (changed bool, was engineState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.state[name]
	if !ok {
		return false, engineState{}
	}
	was = *st
	up := err == nil
	if up != st.up {
		st.up, st.since, changed = up, time.Now(), true
	}
	st.err = err
	return changed, was
}

// down returns why the named provider's engine is down, or nil.
func (e *engines) down(name string) (engineState, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.state[name]
	if !ok || st.up {
		return engineState{}, false
	}
	return *st, true
}

// snapshot returns the state of every watched engine.
func (e *engines) snapshot() map[string]engineState {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]engineState, len(e.state))
	for name, st := range e.state {
		out[name] = *st
	}
	return out
}

// watchEngines checks every watched engine each EngineCheckInterval until the daemon stops.
func (d *Daemon) watchEngines() {
	defer d.bg.Done()
	t := time.NewTicker(d.cfg.EngineCheckInterval)
	defer t.Stop()
	for {
		d.checkEngines()
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
	}
}

// checkEngines checks each watched engine once, all at once, so that one that hangs
// does not delay news of the others.
func (d *Daemon) checkEngines() {
	var wg sync.WaitGroup
	for name := range d.engines.snapshot() {
		p := d.providers[name].(pinger)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), engineCheckTimeout)
			err := p.Ping(ctx)
			cancel()
			d.engineChecked(name, err)
		}()
	}
	wg.Wait()
}

// engineChecked records what a check (or a call that failed for want of an answer)
// found out, logging a change.
func (d *Daemon) engineChecked(name string, err error) {
	changed, was := d.engines.set(name, err)
	switch {
	case !changed:
	case err != nil:
		d.log.Warn("engine not answering: refusing creates for this provider until it answers", "provider", name, "err", err)
	default:
		d.log.Info("engine answering again: creates resume", "provider", name, "down_for", time.Since(was.since).Round(time.Second))
	}
}

// refuseWhileDown fails a create at once while the provider's engine is down.
func (d *Daemon) refuseWhileDown(provider string) error {
	st, down := d.engines.down(provider)
	if !down {
		return nil
	}
	return fmt.Errorf("%w: refusing to create a %s sandbox while its engine is down (since %s; roched checks it every %s): %v",
		roche.ErrUnavailable, provider, st.since.Format(time.TimeOnly), d.cfg.EngineCheckInterval, st.err)
}

// noteCallError marks an engine down at once when a call found it not answering, rather
// than at the next check.
func (d *Daemon) noteCallError(provider string, err error) {
	if errors.Is(err, roche.ErrUnavailable) && errors.Is(err, roche.ErrTimeout) {
		d.engineChecked(provider, err)
	}
}

// engineHealth is the engines' part of /healthz, and whether every one is up.
func (d *Daemon) engineHealth() (map[string]client.EngineHealth, bool) {
	snap := d.engines.snapshot()
	if len(snap) == 0 {
		return nil, true
	}
	out := make(map[string]client.EngineHealth, len(snap))
	allUp := true
	for name, st := range snap {
		h := client.EngineHealth{Up: st.up, Since: st.since}
		if !st.up && st.err != nil {
			h.Error = st.err.Error()
		}
		allUp = allUp && st.up
		out[name] = h
	}
	return out, allUp
}
