//go:build !linux

package oci

// Elsewhere there are no oci sandboxes to watch (see mount_other.go).

func (p *Provider) watchExit(*sandbox) {}
func (p *Provider) stopExitWatches()   {}
