package kubernetes

import (
	"encoding/json"
	"fmt"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/roche-sandbox/roche/provider/docker"
)

// SeccompProfile returns Roche's seccomp profile (the Docker provider's: Docker's default
// without io_uring, ptrace and a few more) as the OCI filter a node's container runtime
// loads for a Localhost profile. Docker's format keeps rules for capabilities and
// kernels, which are resolved here for the capabilities a sandbox's Pod holds (the
// agent's; its commands hold none) and for this machine's kernel and architecture: make
// it where the nodes' kernel and architecture are the same.
func SeccompProfile() ([]byte, error) {
	caps := make([]string, len(agentCaps))
	for i, c := range agentCaps {
		caps[i] = "CAP_" + string(c)
	}
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	filter, err := seccomp.LoadProfile(string(docker.SeccompProfile()), spec)
	if err != nil {
		return nil, fmt.Errorf("resolving Roche's seccomp profile: %w", err)
	}
	return json.MarshalIndent(filter, "", "\t")
}
