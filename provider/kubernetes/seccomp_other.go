//go:build !linux

package kubernetes

import "errors"

// SeccompProfile is made on Linux only, where it is resolved for the nodes' kernel.
func SeccompProfile() ([]byte, error) {
	return nil, errors.New("the seccomp profile is made on Linux, for the nodes' kernel")
}
