package oci

import (
	"fmt"
	"sync"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/roche-sandbox/roche/provider/docker"
)

// seccompFilter is Roche's seccomp profile (the one home is provider/docker's
// seccomp.json) resolved to an OCI filter for the agent's capabilities, once.
var seccompFilter = sync.OnceValues(func() (*specs.LinuxSeccomp, error) {
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: agentCaps}}}
	f, err := seccomp.LoadProfile(string(docker.SeccompProfile()), s)
	if err != nil {
		return nil, fmt.Errorf("resolving Roche's seccomp profile: %w", err)
	}
	return f, nil
})
