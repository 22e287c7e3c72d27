package docker

import (
	"fmt"
	"path/filepath"

	"github.com/docker/docker/api/types/mount"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
)

// Inside a sandbox with an allowlist, programs use egress.SandboxListen as their HTTP
// proxy; roche-agent relays it to the host's proxy through agentspec.EgressSocketName in
// the sandbox's socket directory.

// WithEgressProxy lets sandboxes have a network_allowlist. This process then runs the
// egress proxy of each such sandbox, so it must outlive them: roched does, and so does
// `roche run`; a short-lived `roche create` does not, and must leave this off.
func WithEgressProxy() Option { return func(p *Provider) { p.egress = true } }

// checkEgress refuses an allowlist this provider cannot serve.
func (p *Provider) checkEgress(cfg roche.Config) error {
	if len(cfg.NetworkAllowlist) == 0 {
		return nil
	}
	if p.agentPath == "" {
		return fmt.Errorf("%w: network_allowlist needs roche-agent in the sandbox: %s", roche.ErrUnsupported, guestbin.Install)
	}
	if !p.egress {
		return fmt.Errorf("%w: network_allowlist needs a host process that outlives the sandbox to run its proxy: use roched (roche daemon start) or roche run", roche.ErrUnsupported)
	}
	return nil
}

// startEgress serves the proxy for the sandbox whose directory is dir, on a socket in
// runDir, its sockets' directory (which names the proxy in p.proxies); the CA's
// certificate and the placeholders are kept in dir, out of the sandbox's reach
// (agentdir.go).
func (p *Provider) startEgress(dir, runDir, name string, cfg roche.Config) error {
	_, err := p.proxies.Start(runDir, dir, name, cfg, p.log)
	return err
}

// ensureEgress restarts the proxy of a sandbox found running without one, e.g. after
// roched restarted. One another live process answers on is left to it.
func (p *Provider) ensureEgress(s sandbox) {
	if !p.egress || s.agentDir == "" || len(s.cfg.NetworkAllowlist) == 0 ||
		p.proxies.Serving(s.runDir) || egresswire.Answered(s.runDir) {
		return
	}
	if err := p.startEgress(s.agentDir, s.runDir, filepath.Base(s.agentDir), s.cfg.Config); err != nil {
		p.log.Warn("restarting a sandbox's egress proxy", "sandbox", s.id, "err", err)
	}
	p.proxies.Name(s.runDir, s.id)
}

// egressTrust is what the container of the sandbox whose sockets' directory is runDir
// gets from its proxy: environment and trust-store files (egress.Trust).
func (p *Provider) egressTrust(runDir string) (env []string, mounts []mount.Mount) {
	trust, ok := p.proxies.Trust(runDir)
	if !ok {
		return nil, nil
	}
	for _, f := range trust.Files {
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: f.Host, Target: f.Sandbox, ReadOnly: true})
	}
	return trust.Env, mounts
}

// stopEgress stops the proxy of the sandbox whose directory is dir: its socket is in
// the run subdirectory, or in dir itself for a container made before that (runDirOf).
func (p *Provider) stopEgress(dir string) {
	p.proxies.Stop(filepath.Join(dir, runSubdir))
	p.proxies.Stop(dir)
}
