package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/agent"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Leases through the API: a client that creates a sandbox with leased=true holds it with
// a Hold stream for as long as it wants it. The stream ends when the client lets go or
// its process dies (the kernel closes its connection), and the sandbox is destroyed
// holdGrace later unless another Hold took over; one never held is destroyed firstHold
// after its create. Where the provider has leases (roche.Leaser), roched also holds the
// sandbox's own lease, so a roched killed outright leaves nothing behind for long either.
const (
	firstHold     = 10 * time.Second
	holdGrace     = agent.DefaultLeaseGrace
	holdHeartbeat = 15 * time.Second
	holdCheck     = time.Second
)

// hold counts the Hold streams of one leased sandbox.
type hold struct {
	holders int
	timer   *time.Timer // running while nobody holds it
}

// leaseCreated starts the wait for the first Hold of a leased sandbox just recorded.
func (d *Daemon) leaseCreated(id string, wait time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.awaitHoldLocked(id, wait)
}

// awaitHoldLocked starts the wait for a Hold of sandbox id, unless one is under way.
// Callers hold d.mu, or run before the daemon serves (recover).
func (d *Daemon) awaitHoldLocked(id string, wait time.Duration) {
	if _, ok := d.holds[id]; ok {
		return
	}
	d.holds[id] = &hold{timer: time.AfterFunc(wait, func() { d.holdLost(id) })}
}

// holdLost destroys a leased sandbox nobody holds.
func (d *Daemon) holdLost(id string) {
	d.mu.Lock()
	h, ok := d.holds[id]
	if !ok || h.holders > 0 {
		d.mu.Unlock()
		return
	}
	delete(d.holds, id)
	r, tracked := d.sandboxes[id]
	live := tracked && r.Kind == kindClient
	d.mu.Unlock()
	if !live {
		return
	}
	d.log.Info("leased sandbox no longer held by its client: destroying it", "id", id)
	d.markDestroying(id)
	d.saveOrWarn()
}

// forgetHoldLocked drops the hold state of a sandbox that is gone. Callers hold d.mu.
func (d *Daemon) forgetHoldLocked(id string) {
	if h, ok := d.holds[id]; ok {
		h.timer.Stop()
		delete(d.holds, id)
	}
}

// takeHold counts a Hold in; the returned func counts it out, starting the grace when it
// was the last.
func (d *Daemon) takeHold(t *tenant, id string) (string, func(), error) {
	tg, err := d.resolve(t, id)
	if err != nil {
		return "", nil, err
	}
	if !tg.rec.Leased {
		return "", nil, fmt.Errorf("%w: sandbox %s is not leased: it lives out its timeout; create it with leased=true to hold it", roche.ErrInvalidConfig, tg.id)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.holds[tg.id]
	if !ok {
		// Lost a moment ago: it is being destroyed.
		return "", nil, notFound(id)
	}
	h.holders++
	h.timer.Stop()
	full := tg.id
	return full, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if h.holders--; h.holders == 0 && d.holds[full] == h {
			h.timer.Reset(holdGrace)
		}
	}, nil
}

// Hold holds a leased sandbox until the client goes (see the constants above). It looks
// every holdCheck whether the sandbox still lives, so that a sandbox destroyed under its
// holder (another client's destroy, its lifetime's end, its engine) ends the stream
// within about a second, saying why; it sends a heartbeat every holdHeartbeat.
func (s *service) Hold(ctx context.Context, req *connect.Request[rochev1.HoldRequest], stream *connect.ServerStream[rochev1.HoldResponse]) error {
	t, err := tenantOf(ctx)
	if err != nil {
		return wire.ToStatus(err)
	}
	id, release, err := s.d.takeHold(t, req.Msg.SandboxId)
	if err != nil {
		if errors.Is(err, roche.ErrNotFound) {
			err = s.d.whyNotHeld(t, req.Msg.SandboxId, err)
		}
		return wire.ToStatus(err)
	}
	defer release()
	check := time.NewTicker(holdCheck)
	defer check.Stop()
	var lastSent time.Time
	var last record
	for {
		if err := s.d.heldGone(t, id, &last); err != nil {
			return wire.ToStatus(err)
		}
		if time.Since(lastSent) >= holdHeartbeat {
			if err := stream.Send(&rochev1.HoldResponse{}); err != nil {
				return nil // the client is gone
			}
			lastSent = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.d.draining:
			return wire.ToStatus(fmt.Errorf("%w: roched is shutting down", roche.ErrUnavailable))
		case <-check.C:
		}
	}
}

// whyNotHeld is the error for a Hold that came as its sandbox was being destroyed (a
// destroy between the create and the client's Hold): why, rather than only notFound.
func (d *Daemon) whyNotHeld(t *tenant, id string, notFound error) error {
	d.mu.Lock()
	r, ok := d.sandboxes[id]
	var last record
	if ok {
		last = *r
	}
	d.mu.Unlock()
	if !ok || last.tenantName() != t.name {
		return notFound // another tenant's is not named
	}
	if err := d.heldGone(t, id, &last); err != nil {
		return err
	}
	return notFound
}

// heldGone is nil while the held sandbox id lives, else the NOT_FOUND error that ends
// its Hold, saying why it went. last is what the previous look found, kept up to date:
// a removal may finish between two looks.
func (d *Daemon) heldGone(t *tenant, id string, last *record) error {
	d.mu.Lock()
	r, ok := d.sandboxes[id]
	if ok {
		*last = *r
	}
	d.mu.Unlock()
	if ok && last.Kind == kindClient {
		return nil
	}
	d.ended.mu.Lock()
	_, behindBack := d.ended.byID[id]
	d.ended.mu.Unlock()
	switch {
	case behindBack:
		return d.ended.notFound(t, id) // killed, stopped by its engine: says which
	case !last.ExpiresAt.IsZero() && !time.Now().Before(last.ExpiresAt):
		return fmt.Errorf("%w: sandbox %s was destroyed: its lifetime ended at %s", roche.ErrNotFound, id, last.ExpiresAt.Local().Format(time.TimeOnly))
	default:
		return fmt.Errorf("%w: sandbox %s was destroyed (roche destroy, or another client of roched)", roche.ErrNotFound, id)
	}
}

// leasePooled makes a sandbox just handed out from a pool what the client asked for:
// leased, it is held as a new one is; not leased, its provider-level lease (the pool
// made it leased to roched, so that a roched killed mid-refill leaves nothing for long)
// is ended, and it lives out its timeout. One whose lease cannot be ended is destroyed,
// and false sends the create on to make one.
func (d *Daemon) leasePooled(ctx context.Context, p roche.Provider, id string, leased bool) bool {
	if leased {
		d.mu.Lock()
		if r, ok := d.sandboxes[id]; ok {
			r.Leased = true
		}
		d.mu.Unlock()
		d.leaseCreated(id, firstHold)
		d.saveOrWarn()
		return true
	}
	l, ok := p.(roche.Leaser)
	if !ok || !p.Capabilities().Leases {
		return true
	}
	err := l.Keep(ctx, id)
	if err == nil || errors.Is(err, roche.ErrUnsupported) { // unsupported: made unleased
		return true
	}
	d.log.Warn("a pooled sandbox's lease could not be ended: destroying it and creating one", "id", id, "err", err)
	d.markDestroying(id)
	d.saveOrWarn()
	return false
}
