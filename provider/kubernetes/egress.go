package kubernetes

import (
	"context"
	"fmt"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
)

// WithEgressProxy lets sandboxes have a network_allowlist. Their Pods keep no network
// (only loopback, and a deny-all NetworkPolicy); programs use the agent's proxy port
// (egress.SandboxListen), the agent relays each connection to the relay's egress
// socket, and the relay carries it up the sandbox's relay session to the egress proxy
// this process runs, which alone decides. So this process must outlive the sandboxes:
// roched does, and so does `roche run`; a short-lived `roche create` does not, and must
// leave this off.
func WithEgressProxy() Option { return func(p *Provider) { p.egress = true } }

// egressProxy returns the egress proxy of sandbox id when it has an allowlist and this
// process serves them, else nil. It is made on first use and kept across relay sessions
// (a broken exec stream, a restart's new session), so that its caps count the sandbox's
// whole life. p.sessMu is held.
func (p *Provider) egressProxy(ctx context.Context, id string) (*egress.Proxy, error) {
	if !p.egress {
		return nil, nil
	}
	if px := p.proxies[id]; px != nil {
		return px, nil
	}
	p.mu.Lock()
	s, known := p.verified[id]
	p.mu.Unlock()
	cfg := s.cfg
	if !known {
		pod, err := p.get(ctx, id)
		if err != nil {
			return nil, err
		}
		cfg = configOf(pod)
	}
	if len(cfg.NetworkAllowlist) == 0 {
		return nil, nil
	}
	pol, err := egress.ParsePolicy(cfg.NetworkAllowlist)
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox %s: %v", roche.ErrInvalidConfig, id, err)
	}
	px := egress.New(egress.Options{Policy: pol, Sandbox: id, Log: p.log.With("egress", id)})
	p.proxies[id] = px
	return px, nil
}

// stopEgress closes the egress proxy of sandbox id, if this process runs one.
func (p *Provider) stopEgress(id string) {
	p.sessMu.Lock()
	px := p.proxies[id]
	delete(p.proxies, id)
	p.sessMu.Unlock()
	if px != nil {
		px.Close()
	}
}

// stopAllEgress closes every egress proxy (Close).
func (p *Provider) stopAllEgress() {
	p.sessMu.Lock()
	all := p.proxies
	p.proxies = map[string]*egress.Proxy{}
	p.sessMu.Unlock()
	for _, px := range all {
		px.Close()
	}
}
