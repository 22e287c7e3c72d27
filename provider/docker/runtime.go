package docker

import (
	"context"
	"fmt"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/roche-sandbox/roche"
)

// Runtimes the provider knows how to run sandboxes on (WithRuntime).
const (
	// RuntimeRunc is the engine's default runtime: the sandbox's processes are host
	// processes in namespaces, behind Roche's seccomp profile.
	RuntimeRunc = "runc"
	// RuntimeGVisor is gVisor's runsc, built at a pinned version and registered with the
	// engine under this name by scripts/runsc.sh with --network=none --host-uds=all
	// --oci-seccomp --overlay2=none: a user-space kernel between the sandbox and the
	// host, no network (only loopback), Roche's seccomp profile enforced by that kernel,
	// and writes to the container's own layer.
	RuntimeGVisor = "runsc"
)

// RegisterRunscHint says how to make the engine know RuntimeGVisor.
const RegisterRunscHint = "scripts/runsc.sh installs runsc and registers it with dockerd (sudo bash scripts/runsc.sh)"

// WithRuntime runs every sandbox on the named runtime, as the engine has it registered:
// RuntimeRunc (the default) or RuntimeGVisor. Anything else is refused by New.
func WithRuntime(name string) Option { return func(p *Provider) { p.runtime = name } }

// Runtime returns the runtime sandboxes run on (WithRuntime).
func (p *Provider) Runtime() string { return p.runtime }

// checkRuntime refuses a runtime the provider does not know; "" is the default.
func (p *Provider) checkRuntime() error {
	switch p.runtime {
	case "":
		p.runtime = RuntimeRunc
	case RuntimeRunc, RuntimeGVisor:
	default:
		return fmt.Errorf("%w: runtime %q: use %s or %s (gVisor)", roche.ErrInvalidConfig, p.runtime, RuntimeRunc, RuntimeGVisor)
	}
	return nil
}

func (p *Provider) gvisor() bool { return p.runtime == RuntimeGVisor }

// checkRuntimeConfig refuses, before anything is made, what the runtime cannot give:
// gVisor as registered here has no network stack but loopback.
func (p *Provider) checkRuntimeConfig(cfg roche.Config) error {
	if p.gvisor() && cfg.Network {
		return fmt.Errorf("%w: network on the %s runtime: gVisor runs here with --network=none (only loopback); a network_allowlist, which goes through roche-agent's relay, works, or use the %s runtime",
			roche.ErrUnsupported, RuntimeGVisor, RuntimeRunc)
	}
	return nil
}

// runtimeErr turns the engine's refusal of an unregistered runtime into ErrUnavailable
// saying how to register it.
func (p *Provider) runtimeErr(err error) error {
	if err == nil || !strings.Contains(err.Error(), "unknown or invalid runtime name") {
		return nil
	}
	hint := "register it with dockerd (/etc/docker/daemon.json \"runtimes\", then a SIGHUP to dockerd)"
	if p.gvisor() {
		hint = RegisterRunscHint
	}
	return fmt.Errorf("%w: the Docker engine at %s has no runtime %q: %s", roche.ErrUnavailable, p.cli.DaemonHost(), p.runtime, hint)
}

// hideGVisorDevices takes gVisor's own FUSE and TUN devices out of the sandbox's /dev.
// gVisor puts every device its kernel implements in /dev, mode 0666: /dev/fuse and
// /dev/net/tun too, which runc sandboxes do not offer (Docker gives them neither), so
// the sandbox user could open the sentry's FUSE and TUN code. runsc has no flag to leave
// them out and ignores the spec's masked paths, so they are mounted over: an empty
// read-only tmpfs on /dev/net, and the host's /dev/null, read-only, on /dev/fuse (what a
// masked file is under runc), which gVisor serves as its own /dev/null.
func hideGVisorDevices(hcfg *container.HostConfig) {
	hcfg.Mounts = append(hcfg.Mounts,
		mount.Mount{Type: mount.TypeTmpfs, Target: "/dev/net", ReadOnly: true,
			TmpfsOptions: &mount.TmpfsOptions{SizeBytes: 4096, Mode: 0o555}},
		mount.Mount{Type: mount.TypeBind, Source: "/dev/null", Target: "/dev/fuse", ReadOnly: true},
	)
}

// gvisorHostPids bounds the host threads and processes of a gVisor sandbox whose tasks
// are capped at tasks; beyond the cgroup's limit gVisor's kernel dies with the sandbox.
// Measured with the pinned runsc (systrap platform): an idle sandbox holds ~31, 64
// tasks held ~161, and a fork bomb held at 64 ~200. Debian's 20221219 (ptrace) needed up
// to 16 per task, ~1050 for 63: the bound keeps that margin.
func gvisorHostPids(tasks int) int { return 256 + 24*tasks }

// gvisorNoTerminals is why sandboxes on gVisor have no terminals: the conformance suite
// found what is typed on one never reaching bash's line editor there.
const gvisorNoTerminals = "terminals are not offered on gVisor (--runtime runsc): its pseudo-terminal does not pass typed input to the shell's line editor; use exec, or a sandbox on runc"

// Shell implements roche.Terminal, refusing on gVisor (gvisorNoTerminals).
func (p *Provider) Shell(ctx context.Context, id string, req roche.TerminalRequest, tio roche.TerminalIO) (int, error) {
	if p.gvisor() {
		return 0, fmt.Errorf("%w: %s", roche.ErrUnsupported, gvisorNoTerminals)
	}
	return p.forwarder.Shell(ctx, id, req, tio)
}

// StartTerminal implements roche.Terminal, refusing on gVisor (gvisorNoTerminals).
func (p *Provider) StartTerminal(ctx context.Context, id string, req roche.TerminalRequest) (int, error) {
	if p.gvisor() {
		return 0, fmt.Errorf("%w: %s", roche.ErrUnsupported, gvisorNoTerminals)
	}
	return p.forwarder.StartTerminal(ctx, id, req)
}
