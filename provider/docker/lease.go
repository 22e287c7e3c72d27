package docker

import (
	"context"
	"strconv"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/agentfwd"
)

var _ roche.Leaser = (*Provider)(nil)

// LeaseGrace is how long a leased sandbox outlives the loss of its lease.
const LeaseGrace = agentfwd.LeaseGrace

// leaseArgs are roche-agent's arguments for a leased sandbox: it stops LeaseGrace after
// the last holder goes, or when this create has not taken the lease by the end of its
// own deadline (agentfwd.FirstLease). The lease is held in p.leases (agentfwd.Leases).
func (p *Provider) leaseArgs() []string {
	return []string{
		"--lease-grace", strconv.FormatInt(LeaseGrace.Milliseconds(), 10) + "ms",
		"--first-lease", strconv.FormatInt(agentfwd.FirstLease(p.engineTimeout).Milliseconds(), 10) + "ms",
	}
}

// Keep implements roche.Leaser: the agent ends the lease (agentfwd), and the lease this
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
