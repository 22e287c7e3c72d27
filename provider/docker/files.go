package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
)

var (
	_ roche.BackgroundRunner = (*Provider)(nil)
	_ roche.FileSystem       = (*Provider)(nil)
)

// forwarder serves background processes and the files API (and, for sandboxes with
// roche-agent, commands and tar streams) through the agent (guestfwd); the embedded
// field is unexported.
type forwarder = guestfwd.Forwarder

var _ roche.Terminal = (*Provider)(nil)

// reach returns the sandbox's agent, or ErrUnsupported for a sandbox on the exec-API
// transport.
func (p *Provider) reach(ctx context.Context, id string) (guestfwd.Target, error) {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return guestfwd.Target{}, err
	}
	if s.agent == nil {
		return guestfwd.Target{}, fmt.Errorf("%w: sandbox %s runs without roche-agent (transport %s), and this call needs it", roche.ErrUnsupported, id, TransportDockerExec)
	}
	return p.target(s), nil
}

// target is the agent of s, which has one. An agent that cannot be reached means the
// sandbox has stopped (expired, destroyed, or its agent died) when the engine no longer
// has it.
func (p *Provider) target(s sandbox) guestfwd.Target {
	return guestfwd.Target{
		ID: s.id, Agent: s.agent, Expires: s.expires,
		Gone: func() bool { return p.stopped(s.id) },
	}
}

// stoppedWait is how long a sandbox whose agent dropped a connection is given to be
// reported stopped: the engine hears of the agent's death a moment after the caller does.
const stoppedWait = 2 * time.Second

// stopped reports, after the sandbox's agent could not be reached, whether the sandbox
// has stopped or gone (killed, stopped by its engine, destroyed, or its lifetime over).
func (p *Provider) stopped(id string) bool {
	p.forget(id)
	ctx, cancel := context.WithTimeout(context.Background(), stoppedWait)
	defer cancel()
	for {
		// inspect bounds its own wait, so a hung engine cannot hold this up for long.
		c, _, err := p.inspect(ctx, id)
		switch {
		case errors.Is(err, roche.ErrNotFound):
			return true
		case err != nil:
			return false
		case c.State == nil || !c.State.Running:
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
}
