package docker

import (
	"context"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Leaser = (*Provider)(nil)

// Code contexts are served by roche-agent, through the embedded forwarder.
var _ roche.CodeRunner = (*Provider)(nil)

// LeaseGrace is how long a leased sandbox outlives the loss of its lease. A leased
// sandbox's agent is started with this create's deadline (agentspec.Spec.Lease); the
// lease is held in p.leases (guestfwd.Leases).
const LeaseGrace = agentspec.LeaseGrace

// Keep implements kit.Leaser: the agent ends the lease (guestfwd), and the lease this
// provider held, if any, is let go.
func (p *Provider) Keep(ctx context.Context, id string) error {
	if err := p.forwarder.Keep(ctx, id); err != nil {
		return err
	}
	if s, err := p.lookup(ctx, id); err == nil {
		p.leases.Drop(s.id)
	}
	return nil
}
