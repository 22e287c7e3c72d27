package oci

import (
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
)

// ensureEgress serves again the proxy of a sandbox found without one (this process
// restarted); one another live process answers on is left to it. A proxy started again
// makes a new CA and writes it into the files the sandbox has bound (in place), and
// keeps each secret's placeholder; it holds no secret's value. The proxies themselves
// (egresswire.Proxies) serve on agentspec.EgressSocketName in the sandbox's socket
// directory, where roche-agent relays the sandbox's HTTP proxy connections.
func (p *Provider) ensureEgress(s *sandbox) {
	if !p.egress || len(s.Config.NetworkAllowlist) == 0 || p.proxies.Serving(s.runDir()) || egresswire.Answered(s.runDir()) {
		return
	}
	if _, err := p.proxies.Start(s.runDir(), s.dir, s.ID, s.Config.Config, p.log); err != nil {
		p.log.Warn("restarting a sandbox's egress proxy", "sandbox", s.ID, "err", err)
	}
}
