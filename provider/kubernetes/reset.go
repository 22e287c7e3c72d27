package kubernetes

import (
	"context"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
)

var _ roche.Resetter = (*Provider)(nil)

// Reset implements roche.Resetter: the Pod is deleted and another made from the config it
// carries (its roche.config annotation), with the lifetime it had left, so every change
// to its files and every process is gone; the new sandbox has a new id, the same owner
// and, if this process held the old one's lease, a lease held here too. Its workspace's
// claim is kept, or, without keepWorkspace, removed and made again empty with the size it
// had (a new volume from its StorageClass).
func (p *Provider) Reset(ctx context.Context, id string, keepWorkspace bool) (roche.SandboxInfo, error) {
	pod, err := p.get(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	cfg := configOf(pod)
	if cfg.Image == "" {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s carries no config to reset from", roche.ErrUnsupported, id)
	}
	left := int(time.Until(expiresOf(pod.Labels)).Seconds())
	if left <= 0 {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s has reached the end of its lifetime", roche.ErrNotFound, id)
	}
	cfg.TimeoutSecs = left
	// Leased only if this process still holds its lease: a pool's Pod was made leased,
	// and Keep ended that lease when its client wanted none.
	cfg.Leased = p.leases.Holds(id)
	if err := egresswire.CarryValues(id, cfg.Secrets); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.remove(ctx, id); err != nil {
		return roche.SandboxInfo{}, err
	}
	if !keepWorkspace && cfg.Workspace != "" {
		if err := p.wipeWorkspace(ctx, &cfg); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	return p.create(ctx, cfg)
}
