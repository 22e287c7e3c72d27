package egresswire

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

// Proxies are the egress proxies this process serves for a provider, one per sandbox
// with an allowlist, each on agentspec.EgressSocketName in a directory of the sandbox
// on the host (the oci provider's socket directory, a microVM's state directory), where
// the sandbox's relay brings its HTTP proxy connections. The zero value is ready.
type Proxies struct {
	mu      sync.Mutex
	running map[string]*runningProxy // by directory
}

type runningProxy struct {
	proxy *egress.Proxy
	ln    net.Listener
	trust egress.Trust // what the sandbox gets: CA files, placeholders
}

// Socket is where the proxy of the sandbox whose socket directory is dir listens.
func Socket(dir string) string { return filepath.Join(dir, agentspec.EgressSocketName) }

// Start serves the proxy of sandbox name (its id, which egress.Lookup finds it by) on
// Socket(dir), and returns what the sandbox must get (egress.Trust): the CA files,
// which it keeps in trustDir (a directory of the host never bound into the sandbox
// itself), and the secrets' placeholders. A proxy already served for dir is kept.
func (ps *Proxies) Start(dir, trustDir, name string, cfg roche.Config, log *slog.Logger) (egress.Trust, error) {
	pol, err := egress.ParsePolicy(cfg.NetworkAllowlist)
	if err != nil {
		return egress.Trust{}, fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if rp, ok := ps.running[dir]; ok {
		return rp.trust, nil
	}
	sock := Socket(dir)
	_ = os.Remove(sock) // left by a process that served it before
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return egress.Trust{}, fmt.Errorf("serving the egress proxy at %s: %w", sock, err)
	}
	opts := egress.Options{Policy: pol, Sandbox: name, Log: log.With("egress", name)}
	trust, err := egress.PrepareTrust(&opts, trustDir, name, SecretSpecs(cfg.Secrets))
	if err != nil {
		ln.Close()
		return egress.Trust{}, err
	}
	px := egress.New(opts)
	go px.Serve(ln)
	if ps.running == nil {
		ps.running = map[string]*runningProxy{}
	}
	ps.running[dir] = &runningProxy{proxy: px, ln: ln, trust: trust}
	return trust, nil
}

// Serving reports whether this process serves the proxy of dir.
func (ps *Proxies) Serving(dir string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	_, ok := ps.running[dir]
	return ok
}

// Name gives the proxy of dir, if this process serves it, the name egress.Lookup finds
// it by: the sandbox's id, where that is known only once the sandbox is made.
func (ps *Proxies) Name(dir, name string) {
	ps.mu.Lock()
	rp := ps.running[dir]
	ps.mu.Unlock()
	if rp != nil {
		rp.proxy.SetSandbox(name)
	}
}

// Trust is what the sandbox served by dir's proxy gets (egress.Trust), if this process
// serves it.
func (ps *Proxies) Trust(dir string) (egress.Trust, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	rp, ok := ps.running[dir]
	if !ok {
		return egress.Trust{}, false
	}
	return rp.trust, true
}

// Answered reports whether some process (this one or another live one) answers on
// dir's proxy socket.
func Answered(dir string) bool {
	c, err := net.Dial("unix", Socket(dir))
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Stop stops the proxy of dir, if this process serves it.
func (ps *Proxies) Stop(dir string) {
	ps.mu.Lock()
	rp, ok := ps.running[dir]
	delete(ps.running, dir)
	ps.mu.Unlock()
	if ok {
		rp.ln.Close()
		rp.proxy.Close()
	}
}

// StopAll stops every proxy this process serves.
func (ps *Proxies) StopAll() {
	ps.mu.Lock()
	dirs := make([]string, 0, len(ps.running))
	for d := range ps.running {
		dirs = append(dirs, d)
	}
	ps.mu.Unlock()
	for _, d := range dirs {
		ps.Stop(d)
	}
}
