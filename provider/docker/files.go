package docker

import (
	"context"
	"errors"
	"fmt"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/agentfwd"
)

var (
	_ roche.BackgroundRunner = (*Provider)(nil)
	_ roche.FileSystem       = (*Provider)(nil)
)

// forwarder serves background processes and the files API (and, for sandboxes with
// roche-agent, commands and tar streams) through the agent (agentfwd); the embedded
// field is unexported.
type forwarder = agentfwd.Forwarder

// reach returns the sandbox's agent, or ErrUnsupported for a sandbox on the exec-API
// transport.
func (p *Provider) reach(ctx context.Context, id string) (agentfwd.Target, error) {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return agentfwd.Target{}, err
	}
	if s.agent == nil {
		return agentfwd.Target{}, fmt.Errorf("%w: sandbox %s runs without roche-agent (transport %s), and this call needs it", roche.ErrUnsupported, id, TransportDockerExec)
	}
	return p.target(s), nil
}

// target is the agent of s, which has one. An agent that cannot be reached means the
// sandbox has stopped (expired, destroyed, or its agent died) when the engine no longer
// has it.
func (p *Provider) target(s sandbox) agentfwd.Target {
	return agentfwd.Target{
		ID: s.id, Agent: s.agent, Expires: s.expires,
		Gone: func() bool {
			p.forget(s.id)
			// inspect bounds its own wait, so a hung engine cannot hold this up.
			_, _, err := p.inspect(context.Background(), s.id)
			return errors.Is(err, roche.ErrNotFound)
		},
	}
}
