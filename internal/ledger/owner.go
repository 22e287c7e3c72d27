package ledger

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"

	"github.com/roche-sandbox/roche/internal/defaults"
)

// Owners. Every sandbox roched makes carries roche.Config.Owner
//
//	roched:INSTANCE.STATEKEY           an idle pooled sandbox (nobody's yet)
//	roched:INSTANCE.STATEKEY/TENANT    a sandbox made for, or handed to, TENANT
//
// INSTANCE is a random id kept in the state file, so a roched restarted on the same state
// file is the same owner; STATEKEY names the state file itself (a hash of the host name
// and its absolute path). Of the sandboxes it has no record of, roched destroys its own
// (its INSTANCE and STATEKEY: a create cut short by a crash, whose client was told it
// failed) and adopts those whose owner is provably gone: made by a roched on this very
// state file with another INSTANCE. That
// daemon's state was lost (the file was removed or set aside, which is what made a new
// INSTANCE), and it cannot be running, because this daemon holds the state file's lock.
// Everything else on the engine (other daemons', direct-mode CLI users', sandboxes made
// before owners existed) is left alone: not listed, not counted, not reaped. Each ends
// at its own lifetime anyway.

const ownerPrefix = defaults.DaemonOwnerPrefix

// newInstance makes a daemon instance id.
func newInstance() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// stateKeyOf names a state file: the same on every start of a daemon on that file.
func stateKeyOf(stateFile string) string {
	abs, err := filepath.Abs(stateFile)
	if err != nil {
		abs = stateFile
	}
	host, _ := os.Hostname()
	sum := sha256.Sum256([]byte(host + "\x00" + abs))
	return hex.EncodeToString(sum[:8])
}

// poolOwner is the owner of the sandboxes the pools make.
func (l *Ledger) Owner() string { return ownerPrefix + l.instance + "." + l.stateKey }

// ownerFor is the owner of a tenant's sandbox.
func (l *Ledger) ownerFor(tenant string) string {
	if l.grouped() {
		return l.groupOwner() + "/" + tenant
	}
	return l.Owner() + "/" + tenant
}

// OwnerOf is the owner the daemon gives the sandboxes of the named tenant.
func (l *Ledger) OwnerOf(tenant string) string { return l.ownerFor(tenant) }

// ownerClass is what a sandbox's owner is to this daemon.
type ownerClass int

const (
	// foreignOwner: someone else's; never touched.
	foreignOwner ownerClass = iota
	// ownOwner: made by this daemon (this instance on this state file).
	ownOwner
	// orphanOwner: made by an earlier daemon on this state file whose state was lost.
	orphanOwner
	// sharedOwner: made by a replica of this daemon's group, this one included (group.go).
	sharedOwner
)

// classify says whose a sandbox is, and for a tenant's sandbox, which tenant's.
func (l *Ledger) classify(owner string) (class ownerClass, tenant string) {
	rest, ok := strings.CutPrefix(owner, ownerPrefix)
	if !ok {
		return foreignOwner, ""
	}
	id, tenant, _ := strings.Cut(rest, "/")
	instance, key, ok := strings.Cut(id, ".")
	switch {
	case ok && l.grouped() && instance == groupInstance && key == l.cfg.Group:
		return sharedOwner, tenant
	case !ok || key != l.stateKey:
		return foreignOwner, ""
	case instance == l.instance:
		return ownOwner, tenant
	}
	return orphanOwner, tenant
}
