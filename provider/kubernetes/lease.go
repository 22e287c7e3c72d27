package kubernetes

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
// lease is held in p.leases (guestfwd.Leases): one exec stream through the API server
// kept open, so that when this process dies, however it dies, its connection closes, the
// relay's input ends, and the agent stops the sandbox LeaseGrace later.
const LeaseGrace = agentspec.LeaseGrace

// Keep implements kit.Leaser: the agent ends the lease, and the lease this provider
// held, if any, is let go (guestfwd.Leases.Keep).
func (p *Provider) Keep(ctx context.Context, id string) error {
	return p.leases.Keep(ctx, p.forwarder, id)
}
