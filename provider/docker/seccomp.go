package docker

import (
	"bytes"
	_ "embed"
	"encoding/json"
)

//go:generate go run ./internal/seccompgen -o seccomp.json

// seccompProfile is Roche's seccomp profile: Docker's current default profile without
// io_uring, ptrace, process_vm_readv/writev, modify_ldt and name_to_handle_at (the
// reasons are in internal/seccompgen and docs/security.md). It is applied to every Docker
// sandbox instead of the engine's built-in profile, which on engines before 25.0 (such
// as Debian's 20.10) still allows io_uring.
//
//go:embed seccomp.json
var seccompProfile []byte

// seccompOpt is the security option that applies the profile; the engine takes the
// profile's JSON itself, compacted to keep each container's stored config small.
var seccompOpt = func() string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, seccompProfile); err != nil {
		panic("provider/docker/seccomp.json is not JSON: " + err.Error())
	}
	return "seccomp=" + buf.String()
}()

// SeccompProfile returns Roche's seccomp profile in Docker's format (seccomp.json), for
// the providers that install it elsewhere (the kubernetes provider, as a node's
// Localhost profile).
func SeccompProfile() []byte { return bytes.Clone(seccompProfile) }
