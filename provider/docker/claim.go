package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Claimer = (*Provider)(nil)

// claimFile, in a sandbox's agent directory on the host, is its claim (kit.Claim): a
// container's labels are fixed when it is made, so whose a pooled sandbox became, and
// until when, is kept beside its agent's socket instead. The directory is the host
// user's, mode 0700, and inside the sandbox belongs to a uid the sandbox user is not, so
// sandboxed code can neither read the claim (it may hold the holder's env) nor forge
// one; it goes with the directory when the sandbox is removed.
const claimFile = "claim.json"

// Claim implements kit.Claimer. A sandbox on Docker's exec API has no agent directory
// to keep a claim in, and is refused.
func (p *Provider) Claim(ctx context.Context, id string, c kit.Claim) error {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return err
	}
	dir := p.ownAgentDir(s.agentDir)
	if dir == "" {
		return fmt.Errorf("%w: sandbox %s runs without roche-agent, so it has no directory on the host to keep a claim in", roche.ErrUnsupported, id)
	}
	if !s.expires.IsZero() && c.Expires.After(s.expires) {
		return fmt.Errorf("%w: sandbox %s ends at %s: it cannot be claimed until %s", roche.ErrInvalidConfig, id,
			s.expires.Format(time.RFC3339), c.Expires.Format(time.RFC3339))
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+claimFile)
	if err := writeNew(tmp, b); err != nil {
		return fmt.Errorf("%w: claiming sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, claimFile)); err != nil {
		return fmt.Errorf("%w: claiming sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	p.mu.Lock()
	if v, ok := p.verified[s.id]; ok {
		v.cfg.Owner, v.expires = c.Owner, c.Expires
		p.verified[s.id] = v
	}
	p.mu.Unlock()
	return nil
}

// Claimed implements kit.Claimer.
func (p *Provider) Claimed(ctx context.Context, id string) (kit.Claim, bool, error) {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return kit.Claim{}, false, err
	}
	return p.readClaim(s.agentDir)
}

// readClaim reads the claim in an agent directory of this provider's, if it holds one.
func (p *Provider) readClaim(agentDir string) (kit.Claim, bool, error) {
	dir := p.ownAgentDir(agentDir)
	if dir == "" {
		return kit.Claim{}, false, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, claimFile))
	if errors.Is(err, fs.ErrNotExist) {
		return kit.Claim{}, false, nil
	}
	if err != nil {
		return kit.Claim{}, false, fmt.Errorf("reading the claim in %s: %w", dir, err)
	}
	var c kit.Claim
	if err := json.Unmarshal(b, &c); err != nil {
		return kit.Claim{}, false, fmt.Errorf("reading the claim in %s: %w", dir, err)
	}
	return c, true, nil
}

// claimed applies a sandbox's claim, if it has one, to what is reported of it: its owner
// and its end. One that cannot be read is reported as made (and logged).
func (p *Provider) claimed(agentDir string, owner *string, expires *time.Time) {
	c, ok, err := p.readClaim(agentDir)
	if err != nil {
		p.log.Warn("a sandbox's claim cannot be read: reporting it as its pool made it", "err", err)
	}
	if ok {
		*owner, *expires = c.Owner, c.Expires
	}
	if t, ok := p.readExpires(agentDir); ok {
		*expires = t
	}
}

// ownAgentDir returns dir when it is one of this engine's agent directories (a label
// names it, and only such a directory is read or written, as removeAgentDir removes), else
// "".
func (p *Provider) ownAgentDir(dir string) string {
	if dir == "" || filepath.Dir(dir) != p.agentRoot || !strings.HasPrefix(filepath.Base(dir), agentDirPrefix) {
		return ""
	}
	return dir
}
