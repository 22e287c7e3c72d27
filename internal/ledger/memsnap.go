package ledger

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/roche-sandbox/roche"
)

// memorySnapshotter is tg's provider as a roche.MemorySnapshotter, or the one-line
// refusal of a provider without memory snapshots.
func memorySnapshotter(tg Target, doing string) (roche.MemorySnapshotter, error) {
	ms, ok := tg.Provider.(roche.MemorySnapshotter)
	if !ok {
		return nil, fmt.Errorf("%w: the %s provider cannot %s: memory snapshots are the vm provider's (qemu) only", roche.ErrUnsupported, tg.Provider.Name(), doing)
	}
	return ms, nil
}

// PauseToDisk saves one of tenant t's sandboxes whole to disk and stops it. Its lifetime
// pauses with it: the daemon's reaper leaves it alone until Resume, which brings back
// the time it had left.
func (l *Ledger) PauseToDisk(ctx context.Context, t *Tenant, id string) error {
	tg, err := l.Resolve(t, id)
	if err != nil {
		return err
	}
	ms, err := memorySnapshotter(tg, "pause sandboxes to disk")
	if err != nil {
		return err
	}
	if err := ms.PauseToDisk(ctx, tg.ID); err != nil {
		l.noteCallError(tg.Provider.Name(), err)
		return err
	}
	l.mu.Lock()
	if r, ok := l.sandboxes[tg.ID]; ok {
		r.Paused = true
		r.ExpiresAt = time.Time{} // no end while paused: the provider keeps what was left
	}
	l.mu.Unlock()
	l.saveOrWarn()
	return nil
}

// Resume brings one of tenant t's sandboxes paused to disk back, with the lifetime it
// had left when paused.
func (l *Ledger) Resume(ctx context.Context, t *Tenant, id string) (roche.SandboxInfo, error) {
	tg, err := l.Resolve(t, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	ms, err := memorySnapshotter(tg, "resume sandboxes from disk")
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	sb, err := ms.Resume(ctx, tg.ID)
	if err != nil {
		l.noteCallError(tg.Provider.Name(), err)
		return roche.SandboxInfo{}, err
	}
	l.mu.Lock()
	if r, ok := l.sandboxes[tg.ID]; ok {
		r.Paused = false
		r.ExpiresAt = sb.ExpiresAt
		if !r.direct {
			sb.Owner = l.ownerFor(r.TenantName())
		}
	}
	l.mu.Unlock()
	l.saveOrWarn()
	return sb, nil
}

// Fork makes n copies of one of tenant t's sandboxes, memory and processes included.
// The forks are t's, each counted against the daemon's and t's bounds as a create is,
// each with the lifetime and lease the provider gives it; none is leased by a Hold.
func (l *Ledger) Fork(ctx context.Context, t *Tenant, id string, n int) ([]roche.SandboxInfo, error) {
	if n < 1 || n > roche.MaxForks {
		return nil, fmt.Errorf("%w: fork count %d: give 1 to %d", roche.ErrInvalidConfig, n, roche.MaxForks)
	}
	tg, err := l.Resolve(t, id)
	if err != nil {
		return nil, err
	}
	ms, err := memorySnapshotter(tg, "fork sandboxes")
	if err != nil {
		return nil, err
	}
	origin := *tg.rec
	if err := l.refuseWhileDown(tg.Provider.Name()); err != nil {
		return nil, err
	}
	reserved := 0
	defer func() {
		l.mu.Lock()
		for range reserved {
			l.unreserveLocked(t)
		}
		l.mu.Unlock()
	}()
	if !origin.direct {
		for range n {
			if err := l.admit(t); err != nil {
				return nil, err
			}
			reserved++
		}
	}
	// Not cancelled midway, as Create: a client that goes away cannot leave half-made
	// forks; those made for a client that is gone are destroyed below.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	forks, err := ms.Fork(cctx, tg.ID, n)
	if err != nil {
		l.noteCallError(tg.Provider.Name(), err)
		return nil, err
	}
	now := time.Now()
	l.mu.Lock()
	for i, sb := range forks {
		l.sandboxes[sb.ID] = &Record{
			ID: sb.ID, Provider: origin.Provider, Image: origin.Image, Kind: KindClient, Tenant: origin.Tenant,
			CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, Env: maps.Clone(origin.Env), Workdir: origin.Workdir,
			direct: origin.direct, owner: origin.owner, since: now,
		}
		if !origin.direct {
			forks[i].Owner = l.ownerFor(origin.TenantName())
		}
	}
	for range reserved {
		l.unreserveLocked(t) // the records just made count instead
	}
	reserved = 0
	l.mu.Unlock()
	if ctx.Err() != nil {
		var err error
		for _, sb := range forks {
			err = l.abandon(ctx, sb.ID, "forking a sandbox", "every fork made for it")
		}
		return nil, err
	}
	if err := l.save(); err != nil {
		l.log.Error("saving state for a fork: failing the fork", "id", tg.ID, "err", err)
		for _, sb := range forks {
			l.markDestroying(sb.ID)
		}
		return nil, fmt.Errorf("%w: roched could not save its state file, so a restart would not know the forks are yours: %v "+
			"(they were destroyed; free the state file's disk or fix its directory, then fork again)", roche.ErrUnavailable, err)
	}
	return forks, nil
}
