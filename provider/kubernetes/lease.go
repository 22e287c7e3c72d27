package kubernetes

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/agent"
)

var _ roche.Leaser = (*Provider)(nil)

// LeaseGrace is how long a leased sandbox outlives the loss of its lease.
const LeaseGrace = agent.DefaultLeaseGrace

// leaseArgs are roche-agent's arguments for a leased sandbox: it stops LeaseGrace after
// the last holder goes, or when the create has not taken the lease by the end of its own
// deadline (and a little more: the agent's clock starts first).
func (p *Provider) leaseArgs() []string {
	first := p.createTimeout + 5*time.Second
	return []string{
		"--lease-grace", strconv.FormatInt(LeaseGrace.Milliseconds(), 10) + "ms",
		"--first-lease", strconv.FormatInt(first.Milliseconds(), 10) + "ms",
	}
}

// takeLease holds the lease of a leased sandbox just made, for as long as this provider
// (this process) lives, or until Destroy or Keep. The lease is one exec stream through
// the API server kept open: when this process dies, however it dies, its connection to
// the API server closes, the stream with it, the relay's input ends, and the agent
// stops the sandbox LeaseGrace later.
func (p *Provider) takeLease(ctx context.Context, sb sandbox) error {
	l, err := sb.agent.Lease(ctx)
	if err != nil {
		return fmt.Errorf("taking the lease of sandbox %s: %w", sb.id, err)
	}
	p.mu.Lock()
	p.leases[sb.id] = l
	p.mu.Unlock()
	return nil
}

// dropLease lets go of the lease of sandbox id, if this provider holds it.
func (p *Provider) dropLease(id string) {
	p.mu.Lock()
	l, ok := p.leases[id]
	delete(p.leases, id)
	p.mu.Unlock()
	if ok {
		l.Close()
	}
}

// dropLeases lets go of every lease (Close): the leased sandboxes stop within the grace.
func (p *Provider) dropLeases() {
	p.mu.Lock()
	ls := p.leases
	p.leases = map[string]io.Closer{}
	p.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
}

// Keep implements roche.Leaser: the agent ends the lease (agentfwd), and the lease this
// provider held, if any, is let go.
func (p *Provider) Keep(ctx context.Context, id string) error {
	if err := p.forwarder.Keep(ctx, id); err != nil {
		return err
	}
	p.dropLease(id)
	return nil
}
