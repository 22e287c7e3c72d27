package kubernetes

import (
	"encoding/json"

	"github.com/roche-sandbox/roche/provider/internal/seccomp"
)

// SeccompProfile returns Roche's seccomp profile (provider/internal/seccomp: Docker's
// default without io_uring, ptrace and a few more) as the OCI filter a node's container
// runtime loads for a Localhost profile. Docker's format keeps rules for capabilities
// and kernels, which are resolved here for the capabilities a sandbox's Pod holds (the
// agent's; its commands hold none) and for this machine's kernel and architecture: make
// it where the nodes' kernel and architecture are the same.
func SeccompProfile() ([]byte, error) {
	caps := make([]string, len(agentCaps))
	for i, c := range agentCaps {
		caps[i] = "CAP_" + string(c)
	}
	filter, err := seccomp.Filter(caps)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(filter, "", "\t")
}
