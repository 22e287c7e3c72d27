package docker

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/docker/docker/api/types/mount"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
)

// Inside a sandbox with an allowlist, programs use egress.SandboxListen as their HTTP
// proxy; roche-agent relays it to the host's proxy through agentspec.EgressSocketName in
// the sandbox's socket directory.

// WithEgressProxy lets sandboxes have a network_allowlist. This process then runs the
// egress proxy of each such sandbox, so it must outlive them: roched does, and so does
// `roche run`; a short-lived `roche create` does not, and must leave this off.
func WithEgressProxy() Option { return func(p *Provider) { p.egress = true } }

// runningProxy is one sandbox's egress proxy and the socket it serves.
type runningProxy struct {
	proxy *egress.Proxy
	ln    net.Listener
	trust egress.Trust // what the sandbox's container gets: CA files, placeholders
}

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
// runDir, its sockets' directory; the CA's certificate and the placeholders are kept in
// dir, out of the sandbox's reach (agentdir.go).
func (p *Provider) startEgress(dir, runDir, name string, cfg roche.Config) error {
	pol, err := egress.ParsePolicy(cfg.NetworkAllowlist)
	if err != nil {
		return fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
	}
	p.egressMu.Lock()
	defer p.egressMu.Unlock()
	if _, ok := p.proxies[dir]; ok {
		return nil
	}
	sock := filepath.Join(runDir, agentspec.EgressSocketName)
	_ = os.Remove(sock) // left by a process that ran this proxy before
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("serving the egress proxy at %s: %w", sock, err)
	}
	opts := egress.Options{Policy: pol, Sandbox: name, Log: p.log.With("egress", name)}
	trust, err := egress.PrepareTrust(&opts, dir, name, egresswire.SecretSpecs(cfg.Secrets))
	if err != nil {
		ln.Close()
		return err
	}
	px := egress.New(opts)
	go px.Serve(ln)
	p.proxies[dir] = &runningProxy{proxy: px, ln: ln, trust: trust}
	return nil
}

// ensureEgress restarts the proxy of a sandbox found running without one, e.g. after
// roched restarted.
func (p *Provider) ensureEgress(s sandbox) {
	if !p.egress || s.agentDir == "" || len(s.cfg.NetworkAllowlist) == 0 {
		return
	}
	p.egressMu.Lock()
	_, mine := p.proxies[s.agentDir]
	p.egressMu.Unlock()
	if mine {
		return
	}
	// Another live process may be serving it; only an unanswered socket is taken over.
	if c, err := net.Dial("unix", filepath.Join(s.runDir, agentspec.EgressSocketName)); err == nil {
		c.Close()
		return
	}
	if err := p.startEgress(s.agentDir, s.runDir, filepath.Base(s.agentDir), s.cfg.Config); err != nil {
		p.log.Warn("restarting a sandbox's egress proxy", "sandbox", s.id, "err", err)
	}
	p.nameEgress(s.agentDir, s.id)
}

// nameEgress gives the proxy serving dir its sandbox's id, once the container has one, so
// that roched finds its decision log and policy (egress.Lookup).
func (p *Provider) nameEgress(dir, id string) {
	p.egressMu.Lock()
	rp := p.proxies[dir]
	p.egressMu.Unlock()
	if rp != nil {
		rp.proxy.SetSandbox(id)
	}
}

// egressTrust is what the container of the sandbox whose socket directory is dir gets
// from its proxy: environment and trust-store files (egress.Trust).
func (p *Provider) egressTrust(dir string) (env []string, mounts []mount.Mount) {
	p.egressMu.Lock()
	rp := p.proxies[dir]
	p.egressMu.Unlock()
	if rp == nil {
		return nil, nil
	}
	for _, f := range rp.trust.Files {
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: f.Host, Target: f.Sandbox, ReadOnly: true})
	}
	return rp.trust.Env, mounts
}

func (p *Provider) stopEgress(dir string) {
	p.egressMu.Lock()
	rp, ok := p.proxies[dir]
	delete(p.proxies, dir)
	p.egressMu.Unlock()
	if ok {
		rp.ln.Close()
		rp.proxy.Close()
	}
}

func (p *Provider) stopAllEgress() {
	p.egressMu.Lock()
	dirs := make([]string, 0, len(p.proxies))
	for d := range p.proxies {
		dirs = append(dirs, d)
	}
	p.egressMu.Unlock()
	for _, d := range dirs {
		p.stopEgress(d)
	}
}
