//go:build !linux

package docker

import "errors"

var errNoFirewall = errors.New("the host firewall rules that guard a sandbox's network are Linux iptables rules, and this host is not Linux")

func (p *Provider) checkFirewall() error                    { return errNoFirewall }
func (p *Provider) ensureFirewall() error                   { return errNoFirewall }
func (p *Provider) lockNetwork() (unlock func(), err error) { return func() {}, nil }
