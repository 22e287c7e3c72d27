package ledger

import (
	"context"
	"slices"
	"time"

	"github.com/roche-sandbox/roche"
)

// Direct-mode sandboxes. A user who made sandboxes with roche before starting roched
// (or with roche --direct while it runs) reaches them through roched as if roched had
// made them: listed, and served to exec, copy, shell, reset, destroy, gc and the rest.
// roched takes over exactly those whose owner is Config.DirectOwner, the owner its own
// user's direct-mode CLI gives its sandboxes, and serves them only to a caller on the
// unix socket that runs as that same user (Tenant.Direct, from the socket's
// SO_PEERCRED): never to a TCP tenant, nor to another local user let onto the socket.
// It takes one over when a call of that user first finds it (a list, or a call naming
// it), not in a sweep, so that a sandbox made directly a moment ago is there at once.
//
// Taking over changes nothing of the sandbox: its owner stays the CLI's (roche --direct
// still sees it as its own, and a roched that stops has nothing to hand back), its
// lifetime is its own (the agent ends it, as in direct mode), and a leased one stays
// leased to the process that made it, which destroys it when done. So roched never
// destroys one by itself (at its expiry, for being stopped, for want of a Hold): only
// when its user asks (destroy, gc). Nor does one count towards roched's bounds, which
// are on what roched makes. Its record is never saved: a restarted roched finds it again
// the same way, and the state file never claims a sandbox that is the CLI's.

// directLookupTimeout bounds the provider's answer about an id the ledger does not track.
const directLookupTimeout = 10 * time.Second

// takesOver reports whether sb is a direct-mode sandbox of roched's own user that
// tenant t is to be served.
func (l *Ledger) takesOver(t *Tenant, sb roche.SandboxInfo) bool {
	return t.Direct && l.cfg.DirectOwner != "" && sb.Owner == l.cfg.DirectOwner
}

// adoptDirectLocked records a direct-mode sandbox of the named provider, found by a
// call of its user, unless it has a record already. Callers hold l.mu.
func (l *Ledger) adoptDirectLocked(provider string, sb roche.SandboxInfo) *Record {
	if r, ok := l.sandboxes[sb.ID]; ok {
		return r
	}
	r := &Record{
		ID: sb.ID, Provider: provider, Image: sb.Image, Kind: KindClient, Tenant: LocalTenant,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, Paused: sb.State == roche.StatePaused,
		adopted: true, direct: true, owner: sb.Owner, since: time.Now(),
	}
	l.sandboxes[sb.ID] = r
	l.log.Info("serving a sandbox its user made in direct mode", "provider", provider, "id", sb.ID, "owner", sb.Owner)
	return r
}

// findDirect looks for id among the direct-mode sandboxes tenant t may be served, asking
// the provider that owns such an id (or each one), and takes over the one it finds.
func (l *Ledger) findDirect(t *Tenant, id string) bool {
	if !t.Direct || l.cfg.DirectOwner == "" || id == "" {
		return false
	}
	names := l.names
	if l.cfg.ProviderOf != nil {
		n := l.cfg.ProviderOf(id)
		if !slices.Contains(l.names, n) {
			return false
		}
		names = []string{n}
	}
	ctx, cancel := context.WithTimeout(context.Background(), directLookupTimeout)
	defer cancel()
	for _, n := range names {
		sb, err := l.providers[n].Inspect(ctx, id)
		if err != nil || !l.takesOver(t, sb) {
			continue
		}
		l.mu.Lock()
		l.adoptDirectLocked(n, sb)
		l.mu.Unlock()
		return true
	}
	return false
}
