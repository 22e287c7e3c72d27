//go:build !linux

package seccomp

import (
	"errors"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Filter is resolved on Linux only, for the kernel that runs the sandboxes.
func Filter(caps []string) (*specs.LinuxSeccomp, error) {
	return nil, errors.New("the seccomp filter is resolved on Linux, for the kernel that runs the sandboxes")
}
