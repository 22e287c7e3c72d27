package oci

import (
	"runtime"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/roche-sandbox/roche/provider/internal/seccomp"
)

// nativeArch is the seccomp architecture of this host's own system calls.
var nativeArch = map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}

// seccompFilter is Roche's seccomp profile (provider/internal/seccomp) resolved to an
// OCI filter for the agent's capabilities, once.
//
// The filter covers the host's native architecture only, where Docker's also admits the
// 32-bit ones (x86 and x32 on amd64, arm on arm64): a system call through a 32-bit entry
// point then meets the filter's bad-architecture action and is refused. That closes the
// compat system call paths, a classic home of kernel bugs, at the cost of 32-bit programs
// (none in Roche's images), and halves runc's start: building the filter for three
// architectures took it ~70 ms of a ~150 ms start here.
var seccompFilter = sync.OnceValues(func() (*specs.LinuxSeccomp, error) {
	f, err := seccomp.Filter(agentCaps)
	if err != nil {
		return nil, err
	}
	if arch, ok := nativeArch[runtime.GOARCH]; ok {
		f.Architectures = []specs.Arch{arch}
	}
	return f, nil
})
