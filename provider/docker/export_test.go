package docker

// WithFirewallDir makes the provider look for the iptables tools in dir instead of $PATH.
func WithFirewallDir(dir string) Option { return func(p *Provider) { p.firewallDir = dir } }
