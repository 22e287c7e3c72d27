package docker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
)

var _ roche.LifetimeSetter = (*Provider)(nil)

// expiresFile, in a sandbox's agent directory on the host, is the end SetTimeout gave the
// sandbox (Unix nanoseconds): a container's labels are fixed at its create, so, as a
// claim, the new end is kept beside the agent's socket, out of the sandbox's reach, and
// wins over the label and any claim. What ends the sandbox then is the agent's own timer,
// which SetTimeout resets first.
const expiresFile = "expires"

// SetTimeout implements roche.LifetimeSetter. A sandbox on Docker's exec API has no agent
// to end it at another time, and is refused.
func (p *Provider) SetTimeout(ctx context.Context, id string, d time.Duration) (roche.SandboxInfo, error) {
	if err := roche.ValidTimeout(d); err != nil {
		return roche.SandboxInfo{}, err
	}
	s, err := p.lookup(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	dir := p.ownAgentDir(s.agentDir)
	if dir == "" || s.agent == nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s runs without roche-agent (transport %s), which alone can end it at another time", roche.ErrUnsupported, id, TransportDockerExec)
	}
	end := time.Now().Add(d)
	if err := p.forwarder.SetLifetime(ctx, s.id, d); err != nil {
		return roche.SandboxInfo{}, err
	}
	tmp := filepath.Join(dir, "."+expiresFile)
	if err := writeNew(tmp, []byte(strconv.FormatInt(end.UnixNano(), 10))); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: recording the new end of sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, expiresFile)); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: recording the new end of sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	p.mu.Lock()
	if v, ok := p.verified[s.id]; ok {
		v.expires = end
		p.verified[s.id] = v
	}
	p.mu.Unlock()
	return p.Inspect(ctx, s.id)
}

// readExpires reads the end SetTimeout recorded in an agent directory of this
// provider's, if any.
func (p *Provider) readExpires(agentDir string) (time.Time, bool) {
	dir := p.ownAgentDir(agentDir)
	if dir == "" {
		return time.Time{}, false
	}
	b, err := os.ReadFile(filepath.Join(dir, expiresFile))
	if err != nil {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, n), true
}
