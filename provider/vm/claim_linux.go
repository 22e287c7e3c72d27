package vm

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Claimer = (*Provider)(nil)

// Claim implements kit.Claimer: the VM's meta.json on the host takes the holder as its
// owner and the claim's end as its own, and keeps the claim.
func (p *Provider) Claim(_ context.Context, id string, c kit.Claim) error {
	s, err := p.lookup(id)
	if err != nil {
		return err
	}
	if c.Expires.After(s.ExpiresAt) {
		return fmt.Errorf("%w: sandbox %s ends at %s: it cannot be claimed until %s", roche.ErrInvalidConfig, id,
			s.ExpiresAt.Format(time.RFC3339), c.Expires.Format(time.RFC3339))
	}
	m := s.meta
	m.Config.Owner, m.ExpiresAt, m.Claim = c.Owner, c.Expires, &c
	if err := writeJSON(filepath.Join(m.Dir, "meta.json"), m); err != nil {
		return fmt.Errorf("%w: claiming sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	// A new sandbox in the cache, not the old one changed: others read it unlocked.
	p.remember(&sandbox{meta: m, agent: s.agent})
	return nil
}

// Claimed implements kit.Claimer.
func (p *Provider) Claimed(_ context.Context, id string) (kit.Claim, bool, error) {
	s, err := p.lookup(id)
	if err != nil {
		return kit.Claim{}, false, err
	}
	if s.Claim == nil {
		return kit.Claim{}, false, nil
	}
	return *s.Claim, true, nil
}
