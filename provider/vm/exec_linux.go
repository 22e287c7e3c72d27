package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
)

// forwarder serves commands, background processes, the files API and tar streams
// through the agent inside each VM (guestfwd); the embedded field is unexported.
type forwarder = guestfwd.Forwarder

var _ roche.Terminal = (*Provider)(nil)

// reach returns the agent of a running VM, refusing one that is paused (its agent cannot
// answer). A VM whose agent cannot be reached is gone when its supervisor is.
func (p *Provider) reach(_ context.Context, id string) (guestfwd.Target, error) {
	s, err := p.lookup(id)
	if err != nil {
		return guestfwd.Target{}, err
	}
	if suspended(s.Dir) {
		return guestfwd.Target{}, fmt.Errorf("%w: sandbox %s is paused to disk: resume it first (roche resume %s)", roche.ErrInvalidConfig, id, id)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "paused")); err == nil {
		return guestfwd.Target{}, fmt.Errorf("sandbox %s is paused: unpause it first", id)
	}
	return guestfwd.Target{
		ID: s.ID, Agent: s.agent, Expires: s.ExpiresAt, Workdir: s.Workdir,
		Gone: func() bool {
			if _, alive, err := p.readVM(s.Dir); err != nil || !alive {
				p.forget(s.ID)
				return true
			}
			return false
		},
	}, nil
}

// CopyTo implements roche.FileCopier with the default options (see roche.CopyIn).
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyIn(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyFrom implements roche.FileCopier with the default options (see roche.CopyOut).
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyOut(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}
