package oci

import (
	"context"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Claimer = (*Provider)(nil)

// Claim implements kit.Claimer: the sandbox's record on disk (root's, in its 0700
// directory, which the sandbox cannot reach) takes the holder as its owner and the
// claim's end as its own, and keeps the claim.
func (p *Provider) Claim(ctx context.Context, id string, c kit.Claim) error {
	s, err := p.load(id)
	if err != nil {
		return err
	}
	if c.Expires.After(s.Expires) {
		return fmt.Errorf("%w: sandbox %s ends at %s: it cannot be claimed until %s", roche.ErrInvalidConfig, id,
			s.Expires.Format(time.RFC3339), c.Expires.Format(time.RFC3339))
	}
	r := s.record
	r.Config.Owner, r.Expires, r.Claim = c.Owner, c.Expires, &c
	if err := writeRecord(s.dir, r); err != nil {
		return fmt.Errorf("%w: claiming sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	p.mu.Lock()
	if v, ok := p.verified[id]; ok {
		c2 := *v
		c2.record = r
		p.verified[id] = &c2
	}
	p.mu.Unlock()
	return nil
}

// Claimed implements kit.Claimer.
func (p *Provider) Claimed(ctx context.Context, id string) (kit.Claim, bool, error) {
	s, err := p.load(id)
	if err != nil || s.Claim == nil {
		return kit.Claim{}, false, err
	}
	return *s.Claim, true, nil
}

var _ roche.LifetimeSetter = (*Provider)(nil)

// SetTimeout implements roche.LifetimeSetter: the agent, whose timer ends the sandbox, is
// told the new end first, then the record takes it (and its claim, if it has one).
func (p *Provider) SetTimeout(ctx context.Context, id string, d time.Duration) (roche.SandboxInfo, error) {
	if err := roche.ValidTimeout(d); err != nil {
		return roche.SandboxInfo{}, err
	}
	s, err := p.load(id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	end := time.Now().Add(d)
	if err := p.forwarder.SetLifetime(ctx, id, d); err != nil {
		return roche.SandboxInfo{}, err
	}
	r := s.record
	r.Expires = end
	if r.Claim != nil {
		c := *r.Claim
		c.Expires = end
		r.Claim = &c
	}
	if err := writeRecord(s.dir, r); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: recording the new end of sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	p.mu.Lock()
	if v, ok := p.verified[id]; ok {
		c2 := *v
		c2.record = r
		p.verified[id] = &c2
	}
	p.mu.Unlock()
	return p.Inspect(ctx, id)
}
