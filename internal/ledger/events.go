package ledger

import (
	"context"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Sandboxes die behind roched's back: killed, stopped by an engine that restarts, their
// main process gone. Each provider that can say so as it happens (kit.Watcher: the
// Docker engine's events) is watched, so that a dead sandbox is forgotten at once — its
// record, the state file, its pool's counts, the metrics — and a dead idle pool member
// is replaced, instead of all that waiting for the next reconciliation (30 s). A client
// that later names a sandbox that ended this way hears why it is gone.

// watchSandboxes watches each provider that is a kit.Watcher until the daemon stops.
// The watch starts in the background: an engine that does not answer now must not hold
// up the daemon's start (the watch keeps trying, and the reconciliation covers the gap).
func (l *Ledger) watchSandboxes() {
	for _, name := range l.names {
		w, ok := l.providers[name].(kit.Watcher)
		if !ok {
			continue
		}
		l.bg.Add(1)
		go func() {
			defer l.bg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				select {
				case <-l.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			ch, err := w.Watch(ctx)
			if err != nil {
				if ctx.Err() == nil {
					l.log.Warn("cannot watch sandbox events: dead sandboxes are found at the next reconciliation instead",
						"provider", name, "err", err, "reconcile_every", l.cfg.ReconcileInterval)
				}
				return
			}
			// The channel closes once the watch has let go of everything, after the
			// daemon stops: Close returns only then.
			for ev := range ch {
				l.sandboxEvent(name, ev)
			}
		}()
	}
}

// sandboxEvent acts on one event of the named provider's sandboxes: one the daemon
// tracks that ended is forgotten (what is left of it removed), and, if it was idle in a
// pool, replaced.
func (l *Ledger) sandboxEvent(provider string, ev kit.SandboxEvent) {
	if ev.Kind == kit.EventOOM {
		l.ended.sawOOM(ev.ID, ev.Time)
	}
	if !ev.Ended() {
		l.log.Debug("sandbox event", "provider", provider, "id", ev.ID, "kind", ev.Kind)
		return
	}
	l.mu.Lock()
	r, ok := l.sandboxes[ev.ID]
	if !ok || r.Provider != provider || r.Kind == KindDestroying {
		// Not ours, or a destroy of ours, whose end this is; what the engine says now
		// may still tell why one that ended while a command ran did, also once what was
		// left of it is removed (the event can come after that).
		if ok && r.Kind == KindDestroying {
			l.ended.improve(ev.ID, l.eventEnd(r, ev))
		} else if info, unknown := l.ended.unknown(ev.ID); !ok && unknown && info.Provider == provider {
			gone := &Record{ID: info.ID, Provider: info.Provider, CreatedAt: info.CreatedAt, ExpiresAt: info.ExpiresAt}
			l.ended.improve(ev.ID, l.eventEnd(gone, ev))
		}
		l.mu.Unlock()
		return
	}
	if l.shared(r) {
		// A replica group's sandbox: every replica hears the event, and the leader's
		// reaper, at its next read of the group's sandboxes, removes it once and says
		// why (a lease let go by the last holder is the common end), as without a watch.
		l.mu.Unlock()
		l.log.Debug("a replica group's sandbox ended: left to the leader's reaper", "provider", provider, "id", ev.ID, "kind", ev.Kind)
		return
	}
	was := *r
	// What is left of a direct-mode sandbox is its user's to remove, as in direct mode
	// (direct.go): roched only stops serving it.
	removed := ev.Kind == kit.EventRemoved || r.direct
	if removed {
		delete(l.sandboxes, ev.ID)
	} else {
		// What is left of it (a stopped container) is removed below.
		r.Kind = KindDestroying
	}
	if was.Kind == KindClient {
		l.recordEnd(&was, l.eventEnd(&was, ev), true)
	}
	l.mu.Unlock()
	// Out of its pool's counts at once: an idle member is dropped and replaced, a
	// handed-out one no longer counts towards the pool's total.
	attrs := []any{"provider", provider, "id", ev.ID, "reason", ev.Reason()}
	switch pl := l.poolOf(&was); {
	case was.Kind == KindPooled && pl != nil && !pl.Discard(ev.ID):
		// Not idle: the pool is destroying it itself (idle timeout, drain), or it
		// ended while being handed out, which the hand-out then sees (fromPool).
		l.log.Debug("a pooled sandbox the pool was not holding idle ended", attrs...)
	case was.Kind == KindPooled:
		l.log.Warn("an idle pooled sandbox ended behind roched's back: replacing it", attrs...)
	default:
		if pl != nil {
			pl.Forget(ev.ID)
		}
		attrs = append(attrs, "tenant", was.TenantName())
		if was.direct {
			l.log.Info("a direct-mode sandbox ended (its user's roche destroyed it, or its lifetime ended)", attrs...)
		} else if !was.ExpiresAt.IsZero() && time.Until(was.ExpiresAt) < 2*time.Second {
			l.log.Info("a sandbox ended at its expiry", attrs...)
		} else {
			l.log.Warn("a client's sandbox ended behind roched's back: forgetting it", attrs...)
		}
	}
	if !removed {
		l.startRemoval(ev.ID)
	}
	l.saveOrWarn()
}

// forgetEnded forgets a client's sandbox found gone while a command ran in it (the
// provider said so, perhaps before its engine's event arrived), remembering why for the
// tenant's later calls, and removes what may be left of it.
func (l *Ledger) forgetEnded(id string, err error) {
	l.mu.Lock()
	r, ok := l.sandboxes[id]
	ok = ok && r.Kind == KindClient
	if ok {
		l.recordEnd(r, roche.UnknownEnd(time.Now(), "it stopped while a command ran in it (%v); its engine had not said why yet", err), true)
		// Marked under the same lock as its end is recorded: the engine's event of
		// this end, often on its way at this very moment, then finds it destroying
		// and only tells why (sandboxEvent), instead of recording the end again.
		if r.direct {
			// Its user's to remove, as in direct mode (direct.go).
			delete(l.sandboxes, id)
			ok = false
		} else {
			r.Kind = KindDestroying
		}
	}
	l.mu.Unlock()
	if ok {
		l.log.Warn("sandbox ended behind roched's back: forgetting it", "id", id, "err", err)
		l.startRemoval(id)
		l.saveOrWarn()
	}
}
