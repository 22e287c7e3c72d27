package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
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

var _ roche.LifetimeSetter = (*Provider)(nil)

// SetTimeout implements roche.LifetimeSetter: the guest's agent, whose timer powers the VM
// off, is told the new end first; then meta.json takes it (and its claim, if it has one),
// and the supervisor's backstop deadline follows it (its spec file rewritten, SIGUSR1).
func (p *Provider) SetTimeout(ctx context.Context, id string, d time.Duration) (roche.SandboxInfo, error) {
	if err := roche.ValidTimeout(d); err != nil {
		return roche.SandboxInfo{}, err
	}
	s, err := p.lookup(id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	end := time.Now().Add(d)
	if err := p.forwarder.SetLifetime(ctx, id, d); err != nil {
		return roche.SandboxInfo{}, err
	}
	specPath := filepath.Join(s.Dir, supervisor.SpecFile)
	var spec supervisor.Spec
	b, err := os.ReadFile(specPath)
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: reading the supervisor's spec of sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	spec.DeadlineUnixMS = end.Add(10 * time.Second).UnixMilli()
	if err := writeJSON(specPath, spec); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: recording the new end of sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	if pid := readPID(filepath.Join(s.Dir, supervisor.PIDFile)); pid > 0 && isOurProcess(pid, s.Dir, supervisor.Subcommand) {
		_ = syscall.Kill(pid, syscall.SIGUSR1)
	}
	m := s.meta
	m.ExpiresAt = end
	if m.Claim != nil {
		c := *m.Claim
		c.Expires = end
		m.Claim = &c
	}
	if err := writeJSON(filepath.Join(m.Dir, "meta.json"), m); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: recording the new end of sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	p.remember(&sandbox{meta: m, agent: s.agent})
	return p.Inspect(ctx, id)
}
