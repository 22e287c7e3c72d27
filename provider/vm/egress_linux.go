package vm

import (
	"fmt"
	"os"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
)

// egressGuest gives the guest of a VM with an allowlist what a container gets: the
// agent's HTTP proxy port (egress.SandboxListen, carried to the host over the serial
// link) in the proxy variables, the secrets' placeholders and the CA variables in the
// environment, and the CA's files, which the agent binds read-only at their paths in
// the root. The secrets' values and the CA's key are not in any of it.
func egressGuest(g *vmlink.GuestConfig, trust egress.Trust) error {
	g.EgressListen = egress.SandboxListen
	g.Env = append(append(g.Env, egress.SandboxEnv()...), trust.Env...)
	for _, f := range trust.Files {
		b, err := os.ReadFile(f.Host)
		if err != nil {
			return fmt.Errorf("%w: reading the sandbox's egress CA: %v", roche.ErrUnavailable, err)
		}
		g.TrustFiles = append(g.TrustFiles, vmlink.TrustFile{Path: f.Sandbox, Content: b})
	}
	return nil
}

// trustPaths are the files of a root filesystem the guest agent covers with the egress
// CA's: the root filesystem builder makes them (empty) when the image lacks them, since
// the root is read-only in the VM and a file cannot be made to bind over at boot.
var trustPaths = []string{egress.SandboxBundle, egress.SandboxCACert}

// ensureEgress serves again the proxy of a VM found without one (this process
// restarted); one another live process answers on is left to it. A proxy started again
// makes a new CA, which the guest, whose CA files came in its initramfs, does not
// trust: intercepted hosts then fail certificate verification inside (the safe
// failure) until the sandbox is recreated. It keeps each secret's placeholder
// (recorded in the VM's directory) and holds no secret's value until it is set again.
func (p *Provider) ensureEgress(s *sandbox) {
	if !p.egressHere() || len(s.Config.NetworkAllowlist) == 0 || p.proxies.Serving(s.Dir) || egresswire.Answered(s.Dir) {
		return
	}
	if _, err := p.proxies.Start(s.Dir, s.Dir, s.ID, s.Config.Config, p.log); err != nil {
		p.log.Warn("restarting a sandbox's egress proxy", "sandbox", s.ID, "err", err)
	}
}

// noSnapshotWithEgress refuses a memory snapshot (a fork, a pause to disk, a template)
// of a VM with an allowlist: its proxy, CA key and secrets are this process's, bound to
// the one sandbox, and a restored copy would either share them or hold a CA nobody
// serves.
func noSnapshotWithEgress(s *sandbox) error {
	if len(s.Config.NetworkAllowlist) == 0 {
		return nil
	}
	return fmt.Errorf("%w: sandbox %s has an egress allowlist: memory snapshots (fork, pause to disk, templates) of a VM with egress are not supported, since its proxy, CA and secrets belong to this one sandbox; pause it in memory, or create new sandboxes with the allowlist", roche.ErrUnsupported, s.ID)
}
