//go:build !linux

package docker

import (
	"fmt"

	"github.com/roche-sandbox/roche"
)

// pinSource needs Linux's bind mounts; elsewhere WithPinnedMounts refuses host mounts.
func (p *Provider) pinSource(src string) (string, func(), error) {
	return "", nil, fmt.Errorf("%w: pinned host mounts (mount source %s) need Linux", roche.ErrUnsupported, src)
}
