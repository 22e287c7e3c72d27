package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Leases: a client that creates a sandbox with leased=true holds it with
// a Hold stream for as long as it wants it. The stream ends when the client lets go or
// its process dies (the kernel closes its connection), and the sandbox is destroyed
// HoldGrace later unless another Hold took over; one never held is destroyed FirstHold
// after its create. Where the provider has leases (kit.Leaser), roched also holds the
// sandbox's own lease, so a roched killed outright leaves nothing behind for long either.
const (
	FirstHold = 10 * time.Second
	HoldGrace = guest.DefaultLeaseGrace
)

// hold counts the Holds (the edge's Hold streams) of one leased sandbox.
type hold struct {
	holders int
	held    bool        // a Hold has counted in (so its loss is a holder gone, not one never come)
	timer   *time.Timer // running while nobody holds it
}

// leaseCreated starts the wait for the first Hold of a leased sandbox just recorded.
func (l *Ledger) leaseCreated(id string, wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.awaitHoldLocked(id, wait)
}

// awaitHoldLocked starts the wait for a Hold of sandbox id, unless one is under way.
// Callers hold l.mu, or run before the daemon serves (recover).
func (l *Ledger) awaitHoldLocked(id string, wait time.Duration) {
	if _, ok := l.holds[id]; ok {
		return
	}
	l.holds[id] = &hold{timer: time.AfterFunc(wait, func() { l.holdLost(id) })}
}

// holdLost destroys a leased sandbox nobody holds.
func (l *Ledger) holdLost(id string) {
	l.mu.Lock()
	h, ok := l.holds[id]
	if !ok || h.holders > 0 {
		l.mu.Unlock()
		return
	}
	delete(l.holds, id)
	r, tracked := l.sandboxes[id]
	live := tracked && r.Kind == KindClient
	var last Record
	if live {
		last = *r
	}
	l.mu.Unlock()
	if tracked && l.shared(&last) {
		// Another replica may hold it: the agent stops it once the last one lets go,
		// and the group's leader reaps it then.
		l.dropShared(id, last.Provider)
		return
	}
	evidence := fmt.Sprintf("no Hold stream for %s after its last one ended", HoldGrace)
	if !h.held {
		evidence = fmt.Sprintf("no Hold stream opened within %s of its create", FirstHold)
	}
	if !live {
		return
	}
	l.log.Info("leased sandbox no longer held by its client: destroying it", "id", id)
	l.recordEnd(&last, roche.EndReason{Kind: roche.EndLeaseLost, Detail: "it was leased and its holder went away (its Hold stream ended, or was never opened) and nobody held it again",
		Evidence: evidence}, false)
	l.markDestroying(id)
	l.saveOrWarn()
}

// forgetHoldLocked drops the hold state of a sandbox that is gone. Callers hold l.mu.
func (l *Ledger) forgetHoldLocked(id string) {
	if h, ok := l.holds[id]; ok {
		h.timer.Stop()
		delete(l.holds, id)
	}
}

// Hold counts in a Hold of tenant t's leased sandbox id, returning its full id; the
// returned func counts it out, starting the grace when it was the last.
func (l *Ledger) Hold(t *Tenant, id string) (string, func(), error) {
	tg, err := l.Resolve(t, id)
	if err != nil {
		return "", nil, err
	}
	if tg.rec.direct {
		return "", nil, fmt.Errorf("%w: sandbox %s was made in direct mode: a lease it has is held by the roche that made it (roche run, create --hold), not through roched; it lives until then or until its timeout", roche.ErrInvalidConfig, tg.ID)
	}
	shared := l.shared(tg.rec)
	if !tg.rec.Leased && !shared {
		return "", nil, fmt.Errorf("%w: sandbox %s is not leased: it lives out its timeout; create it with leased=true to hold it", roche.ErrInvalidConfig, tg.ID)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.holds[tg.ID]
	if !ok && shared {
		// A group's sandbox made or last held through another replica: this one
		// holds its lease from now on too.
		l.mu.Unlock()
		err := l.holdShared(tg)
		l.mu.Lock()
		if err != nil {
			return "", nil, err
		}
		l.awaitHoldLocked(tg.ID, FirstHold)
		h, ok = l.holds[tg.ID]
	}
	if !ok {
		// Lost a moment ago: it is being destroyed.
		return "", nil, NotFound(id)
	}
	h.holders++
	h.held = true
	h.timer.Stop()
	full := tg.ID
	return full, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if h.holders--; h.holders == 0 && l.holds[full] == h {
			h.timer.Reset(HoldGrace)
		}
	}, nil
}

// HeldGone is nil while the held sandbox id (a full id) is still tenant t's, else the
// NOT_FOUND error that ends its Hold, saying why it went. last is what the previous look
// found, kept up to date by the call: a removal may finish between two looks.
func (l *Ledger) HeldGone(t *Tenant, id string, last *Record) error {
	l.mu.Lock()
	r, ok := l.sandboxes[id]
	if ok {
		*last = *r
	}
	l.mu.Unlock()
	if ok && last.Kind == KindClient {
		return nil
	}
	l.ended.mu.Lock()
	e, ok := l.ended.byID[id]
	l.ended.mu.Unlock()
	behindBack := ok && e.behindBack
	// The agent stops a sandbox at the end of its lifetime too, which the engine reports
	// as its main process ending, often before the reaper's next look: that is the
	// lifetime's end, not a kill.
	lifetimeOver := !last.ExpiresAt.IsZero() && !time.Now().Before(last.ExpiresAt)
	if behindBack {
		lifetimeOver = !last.ExpiresAt.IsZero() && !e.reason.At.Before(last.ExpiresAt.Add(-time.Second))
	}
	switch {
	case behindBack && !lifetimeOver:
		return l.ended.notFound(t, id) // killed, stopped by its engine: says which
	case lifetimeOver:
		return fmt.Errorf("%w: sandbox %s was destroyed: its lifetime ended at %s", roche.ErrNotFound, id, last.ExpiresAt.Local().Format(time.TimeOnly))
	default:
		return fmt.Errorf("%w: sandbox %s was destroyed (roche destroy, or another client of roched)", roche.ErrNotFound, id)
	}
}

// WhyNotHeld is the error for a Hold that came as its sandbox was being destroyed (a
// destroy between the create and the client's Hold): why, rather than only notFound.
// Another tenant's sandbox is never named.
func (l *Ledger) WhyNotHeld(t *Tenant, id string, notFound error) error {
	l.mu.Lock()
	r, ok := l.sandboxes[id]
	var last Record
	if ok {
		last = *r
	}
	l.mu.Unlock()
	if !ok || last.TenantName() != t.Name {
		return notFound
	}
	if err := l.HeldGone(t, id, &last); err != nil {
		return err
	}
	return notFound
}

// leasePooled makes a sandbox just handed out from a pool what the client asked for:
// leased, it is held as a new one is; not leased, its provider-level lease (the pool
// made it leased to roched, so that a roched killed mid-refill leaves nothing for long)
// is ended, and it lives out its timeout. One whose lease cannot be ended is destroyed,
// and false sends the create on to make one.
func (l *Ledger) leasePooled(ctx context.Context, p roche.Provider, id string, leased bool) bool {
	if leased {
		l.mu.Lock()
		if r, ok := l.sandboxes[id]; ok {
			r.Leased = true
		}
		l.mu.Unlock()
		l.leaseCreated(id, FirstHold)
		l.saveOrWarn()
		return true
	}
	ls, ok := p.(kit.Leaser)
	if !ok || !p.Capabilities().Leases {
		return true
	}
	err := ls.Keep(ctx, id)
	if err == nil || errors.Is(err, roche.ErrUnsupported) { // unsupported: made unleased
		return true
	}
	l.log.Warn("a pooled sandbox's lease could not be ended: destroying it and creating one", "id", id, "err", err)
	l.markDestroying(id)
	l.saveOrWarn()
	return false
}

// Holders is how many Hold streams count in for sandbox id now.
func (l *Ledger) Holders(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.holds[id]; ok {
		return h.holders
	}
	return 0
}
