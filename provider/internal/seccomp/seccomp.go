// Package seccomp is Roche's seccomp profile, the one home of it: every provider that runs
// processes on a host kernel applies it, in the form its runtime takes. The Docker
// provider hands the engine the profile itself (DockerOpt); the oci provider writes the
// filter it resolves to into each sandbox's runtime config, and the kubernetes provider
// installs that filter on its nodes as a Localhost profile (Filter).
package seccomp

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"sync"
)

//go:generate go run ./internal/seccompgen -o seccomp.json

// profile is Roche's seccomp profile in Docker's format: Docker's current default profile
// without io_uring, ptrace, process_vm_readv/writev, modify_ldt and name_to_handle_at
// (the reasons are in internal/seccompgen and docs/security.md). Docker sandboxes get it
// instead of the engine's built-in profile, which on engines before 25.0 (such as
// Debian's 20.10) still allows io_uring.
//
//go:embed seccomp.json
var profile []byte

// dockerOpt is the security option that applies the profile; the engine takes the
// profile's JSON itself, compacted to keep each container's stored config small. It is
// made on first use, not when the package initialises: every run of roched, and of the
// full CLI, links this package, and most never make a Docker sandbox.
var dockerOpt = sync.OnceValue(func() string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, profile); err != nil {
		panic("provider/internal/seccomp/seccomp.json is not JSON: " + err.Error())
	}
	return "seccomp=" + buf.String()
})

// Profile returns Roche's seccomp profile in Docker's format (seccomp.json).
func Profile() []byte { return bytes.Clone(profile) }

// DockerOpt is the Docker security option (HostConfig.SecurityOpt) that applies the
// profile to a container.
func DockerOpt() string { return dockerOpt() }
