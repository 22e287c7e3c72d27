package wasm

import (
	"context"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Claimer = (*Provider)(nil)

// Claim implements kit.Claimer: the sandbox's record on disk (outside the directory
// the sandbox sees) takes the holder as its owner and the claim's end as its own, and
// keeps the claim.
func (p *Provider) Claim(_ context.Context, id string, c kit.Claim) error {
	rec, err := p.lookup(id)
	if err != nil {
		return err
	}
	if c.Expires.After(rec.ExpiresAt) {
		return fmt.Errorf("%w: sandbox %s ends at %s: it cannot be claimed until %s", roche.ErrInvalidConfig, id,
			rec.ExpiresAt.Format(time.RFC3339), c.Expires.Format(time.RFC3339))
	}
	rec.Config.Owner, rec.ExpiresAt, rec.Claim = c.Owner, c.Expires, &c
	if err := writeRecord(p.sandboxDir(id), rec); err != nil {
		return fmt.Errorf("%w: claiming sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	return nil
}

// Claimed implements kit.Claimer.
func (p *Provider) Claimed(_ context.Context, id string) (kit.Claim, bool, error) {
	rec, err := p.lookup(id)
	if err != nil || rec.Claim == nil {
		return kit.Claim{}, false, err
	}
	return *rec.Claim, true, nil
}

var _ roche.LifetimeSetter = (*Provider)(nil)

// SetTimeout implements roche.LifetimeSetter: the record takes the new end (and its claim,
// if it has one). Nothing of a wasm sandbox runs between execs, so that end is what
// bounds its commands, and what roched's reaper and roche gc end it at.
func (p *Provider) SetTimeout(_ context.Context, id string, d time.Duration) (roche.SandboxInfo, error) {
	if err := roche.ValidTimeout(d); err != nil {
		return roche.SandboxInfo{}, err
	}
	p.recordMu.Lock()
	defer p.recordMu.Unlock()
	rec, err := p.lookup(id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	rec.ExpiresAt = time.Now().Add(d)
	if rec.Claim != nil {
		c := *rec.Claim
		c.Expires = rec.ExpiresAt
		rec.Claim = &c
	}
	if err := writeRecord(p.sandboxDir(id), rec); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: recording the new end of sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	return rec.info(), nil
}
