package docker

import (
	"context"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Leaser = (*Provider)(nil)

// Code contexts are served by roche-agent, through the embedded forwarder.
var _ roche.CodeRunner = (*Provider)(nil)

// LeaseGrace is how long a leased sandbox outlives the loss of its lease.
const LeaseGrace = guestfwd.LeaseGrace

// leaseArgs are roche-agent's arguments for a leased sandbox, bounded by this create's
// deadline (guestfwd.LeaseArgs). The lease is held in p.leases (guestfwd.Leases).
func (p *Provider) leaseArgs() []string { return guestfwd.LeaseArgs(p.engineTimeout) }

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
