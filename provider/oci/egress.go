package oci

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
)

// proxies are the egress proxies this process serves, one per sandbox with an allowlist,
// each on agentspec.EgressSocketName in the sandbox's socket directory, where roche-agent
// relays the sandbox's HTTP proxy connections (as in Docker sandboxes).
type proxies struct {
	mu      sync.Mutex
	running map[string]*runningProxy // by socket directory
}

type runningProxy struct {
	proxy *egress.Proxy
	ln    net.Listener
	trust egress.Trust // what the sandbox gets: CA files, placeholders
}

// start serves the proxy of the sandbox whose socket directory is runDir, and returns
// what its container must get (egress.Trust): the CA files, which it keeps in trustDir
// (the sandbox's directory, never bound into it: the sandbox reads them only through
// the read-only binds the spec makes), and the secrets' placeholders.
func (ps *proxies) start(runDir, trustDir, name string, cfg roche.Config, log *slog.Logger) (egress.Trust, error) {
	pol, err := egress.ParsePolicy(cfg.NetworkAllowlist)
	if err != nil {
		return egress.Trust{}, fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if rp, ok := ps.running[runDir]; ok {
		return rp.trust, nil
	}
	sock := filepath.Join(runDir, agentspec.EgressSocketName)
	_ = os.Remove(sock) // left by a process that served it before
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return egress.Trust{}, fmt.Errorf("serving the egress proxy at %s: %w", sock, err)
	}
	opts := egress.Options{Policy: pol, Sandbox: name, Log: log.With("egress", name)}
	trust, err := egress.PrepareTrust(&opts, trustDir, name, egresswire.SecretSpecs(cfg.Secrets))
	if err != nil {
		ln.Close()
		return egress.Trust{}, err
	}
	px := egress.New(opts)
	go px.Serve(ln)
	if ps.running == nil {
		ps.running = map[string]*runningProxy{}
	}
	ps.running[runDir] = &runningProxy{proxy: px, ln: ln, trust: trust}
	return trust, nil
}

func (ps *proxies) serving(dir string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	_, ok := ps.running[dir]
	return ok
}

func (ps *proxies) stop(dir string) {
	ps.mu.Lock()
	rp, ok := ps.running[dir]
	delete(ps.running, dir)
	ps.mu.Unlock()
	if ok {
		rp.ln.Close()
		rp.proxy.Close()
	}
}

func (ps *proxies) stopAll() {
	ps.mu.Lock()
	dirs := make([]string, 0, len(ps.running))
	for d := range ps.running {
		dirs = append(dirs, d)
	}
	ps.mu.Unlock()
	for _, d := range dirs {
		ps.stop(d)
	}
}

// ensureEgress serves again the proxy of a sandbox found without one (this process
// restarted); one another live process answers on is left to it. A proxy started again
// makes a new CA and writes it into the files the sandbox has bound (in place), and
// keeps each secret's placeholder; it holds no secret's value.
func (p *Provider) ensureEgress(s *sandbox) {
	if !p.egress || len(s.Config.NetworkAllowlist) == 0 || p.proxies.serving(s.runDir()) {
		return
	}
	if c, err := net.Dial("unix", filepath.Join(s.runDir(), agentspec.EgressSocketName)); err == nil {
		c.Close()
		return
	}
	if _, err := p.proxies.start(s.runDir(), s.dir, s.ID, s.Config.Config, p.log); err != nil {
		p.log.Warn("restarting a sandbox's egress proxy", "sandbox", s.ID, "err", err)
	}
}
