package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
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

// EngineState is what the last check of one engine found.
type EngineState struct {
	Up    bool
	Since time.Time // when it last changed
	Err   error     // why it is down
}

// engines holds the state of every watched engine, by provider name.
type engines struct {
	mu    sync.Mutex
	state map[string]*EngineState
}

func newEngines(providers map[string]roche.Provider) *engines {
	e := &engines{state: map[string]*EngineState{}}
	now := time.Now()
	for name, p := range providers {
		if _, ok := p.(pinger); ok {
			// Assumed up until a check says otherwise, so a start-up never refuses.
			e.state[name] = &EngineState{Up: true, Since: now}
		}
	}
	return e
}

// set records a check's result and reports whether it changed the state.
func (e *engines) set(name string, err error) (changed bool, was EngineState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.state[name]
	if !ok {
		return false, EngineState{}
	}
	was = *st
	up := err == nil
	if up != st.Up {
		st.Up, st.Since, changed = up, time.Now(), true
	}
	st.Err = err
	return changed, was
}

// down returns why the named provider's engine is down, or nil.
func (e *engines) down(name string) (EngineState, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.state[name]
	if !ok || st.Up {
		return EngineState{}, false
	}
	return *st, true
}

// snapshot returns the state of every watched engine.
func (e *engines) snapshot() map[string]EngineState {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]EngineState, len(e.state))
	for name, st := range e.state {
		out[name] = *st
	}
	return out
}

// watchEngines checks every watched engine each EngineCheckInterval until the daemon stops.
func (l *Ledger) watchEngines() {
	defer l.bg.Done()
	t := time.NewTicker(l.cfg.EngineCheckInterval)
	defer t.Stop()
	for {
		l.checkEngines()
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
	}
}

// checkEngines checks each watched engine once, all at once, so that one that hangs
// does not delay news of the others.
func (l *Ledger) checkEngines() {
	var wg sync.WaitGroup
	for name := range l.engines.snapshot() {
		p := l.providers[name].(pinger)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), engineCheckTimeout)
			err := p.Ping(ctx)
			cancel()
			l.engineChecked(name, err)
		}()
	}
	wg.Wait()
}

// engineChecked records what a check (or a call that failed for want of an answer)
// found out, logging a change.
func (l *Ledger) engineChecked(name string, err error) {
	changed, was := l.engines.set(name, err)
	switch {
	case !changed:
	case err != nil:
		l.log.Warn("engine not answering: refusing creates for this provider until it answers", "provider", name, "err", err)
	default:
		l.log.Info("engine answering again: creates resume", "provider", name, "down_for", time.Since(was.Since).Round(time.Second))
	}
}

// refuseWhileDown fails a create at once while the provider's engine is down.
func (l *Ledger) refuseWhileDown(provider string) error {
	st, down := l.engines.down(provider)
	if !down {
		return nil
	}
	return fmt.Errorf("%w: refusing to create a %s sandbox while its engine is down (since %s; roched checks it every %s): %v",
		roche.ErrUnavailable, provider, st.Since.Format(time.TimeOnly), l.cfg.EngineCheckInterval, st.Err)
}

// noteCallError marks an engine down at once when a call found it not answering, rather
// than at the next check.
func (l *Ledger) noteCallError(provider string, err error) {
	if errors.Is(err, roche.ErrUnavailable) && errors.Is(err, roche.ErrTimeout) {
		l.engineChecked(provider, err)
	}
}

// Engines returns what the last check of each watched engine found, by provider name;
// providers whose engine is not watched (no Ping) are not there.
func (l *Ledger) Engines() map[string]EngineState { return l.engines.snapshot() }
