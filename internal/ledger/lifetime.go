package ledger

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/roche-sandbox/roche"
)

// SetTimeout makes one of tenant t's sandboxes end d from now, within t's maximum
// lifetime and the product's: the provider's sandbox is told (its agent's timer, its
// record), then the record roched reaps by, which is saved before the caller hears of it.
func (l *Ledger) SetTimeout(ctx context.Context, t *Tenant, id string, d time.Duration) (roche.SandboxInfo, error) {
	if err := roche.ValidTimeout(d); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := t.permitTimeout(int(math.Ceil(d.Seconds()))); err != nil {
		return roche.SandboxInfo{}, err
	}
	tg, err := l.Resolve(t, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	ls, ok := tg.Provider.(roche.LifetimeSetter)
	if !ok {
		return roche.SandboxInfo{}, fmt.Errorf("%w: the %s provider cannot change a sandbox's lifetime", roche.ErrUnsupported, tg.Provider.Name())
	}
	sb, err := ls.SetTimeout(ctx, tg.ID, d)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	l.mu.Lock()
	r, ok := l.sandboxes[tg.ID]
	if ok {
		r.ExpiresAt = sb.ExpiresAt
	}
	l.mu.Unlock()
	if !ok {
		return roche.SandboxInfo{}, NotFound(id)
	}
	if err := l.save(); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: the sandbox's new end could not be saved: %v", roche.ErrUnavailable, err)
	}
	if !tg.rec.direct {
		sb.Owner = l.ownerFor(tg.rec.TenantName())
	}
	return sb, nil
}
