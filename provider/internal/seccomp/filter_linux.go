package seccomp

import (
	"fmt"

	moby "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Filter resolves the profile to the OCI filter a runtime loads, for a process whose
// bounding set holds caps ("CAP_SETUID", ...) and for this machine's kernel: Docker's
// format keeps rules that depend on both, which the engine resolves for each container.
func Filter(caps []string) (*specs.LinuxSeccomp, error) {
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	f, err := moby.LoadProfile(string(profile), s)
	if err != nil {
		return nil, fmt.Errorf("resolving Roche's seccomp profile: %w", err)
	}
	return f, nil
}
