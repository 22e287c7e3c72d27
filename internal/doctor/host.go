package doctor

import (
	"fmt"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Host is what the providers depend on of this host, besides what each checks itself:
// the kernel, its cgroups and their delegation, user namespaces, and the agent binary
// that every sandbox but wasm's runs.
func Host() []kit.Finding {
	out := hostKernel()
	path := guestbin.Path()
	switch {
	case path == "":
		out = append(out, kit.Lacks("agent", fmt.Errorf("%w: roche-agent was not found (beside roche, in %s, or on PATH): every sandbox but wasm's runs it", roche.ErrUnavailable, guestbin.Env),
			guestbin.InstallCommand, false))
	case !guestbin.Static(path):
		out = append(out, kit.Lacks("agent", fmt.Errorf("%w: roche-agent at %s is not a static binary, and images may have no C library", roche.ErrUnavailable, path),
			guestbin.InstallCommand, false))
	default:
		out = append(out, kit.Found("agent", nil, path))
	}
	return out
}
