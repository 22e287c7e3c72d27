//go:build !linux

package oci

import specs "github.com/opencontainers/runtime-spec/specs-go"

// seccompFilter needs Linux, as the whole provider does.
func seccompFilter() (*specs.LinuxSeccomp, error) { return nil, errNotLinux }
