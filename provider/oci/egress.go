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
}

func (ps *proxies) start(dir, name string, allow []string, log *slog.Logger) error {
	pol, err := egress.ParsePolicy(allow)
	if err != nil {
		return fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if _, ok := ps.running[dir]; ok {
		return nil
	}
	sock := filepath.Join(dir, agentspec.EgressSocketName)
	_ = os.Remove(sock) // left by a process that served it before
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("serving the egress proxy at %s: %w", sock, err)
	}
	px := egress.New(egress.Options{Policy: pol, Sandbox: name, Log: log.With("egress", name)})
	go px.Serve(ln)
	if ps.running == nil {
		ps.running = map[string]*runningProxy{}
	}
	ps.running[dir] = &runningProxy{proxy: px, ln: ln}
	return nil
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
// restarted); one another live process answers on is left to it.
func (p *Provider) ensureEgress(s *sandbox) {
	if !p.egress || len(s.Config.NetworkAllowlist) == 0 || p.proxies.serving(s.runDir()) {
		return
	}
	if c, err := net.Dial("unix", filepath.Join(s.runDir(), agentspec.EgressSocketName)); err == nil {
		c.Close()
		return
	}
	if err := p.proxies.start(s.runDir(), s.ID, s.Config.NetworkAllowlist, p.log); err != nil {
		p.log.Warn("restarting a sandbox's egress proxy", "sandbox", s.ID, "err", err)
	}
}
