package cli

import (
	"errors"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
)

// The sandboxes this CLI makes in-process belong to defaults.DirectOwner: this user on
// this host (ROCHE_OWNER overrides it, e.g. to share one owner across a CI job's hosts).
// list, gc and destroy --all keep to them, so that one user's cleanup never takes
// another user's sandboxes, or a daemon's, on a shared engine; and a roched of the same
// user serves them to that user as its own (internal/ledger, direct.go).

// ownerFilter returns the owner whose sandboxes a list, gc or destroy --all of p keeps
// to: this CLI's own in-process, none with --any-owner, and none through roched, which
// shows each tenant only its own already.
func (e *env) ownerFilter(p roche.Provider, anyOwner bool) string {
	if _, remote := p.(*client.Provider); remote || anyOwner {
		return ""
	}
	return e.owner()
}

// checkAnyOwner refuses --any-owner where it cannot mean anything: through roched.
func (e *env) checkAnyOwner(anyOwner bool) error {
	if anyOwner && !e.daemon.direct && e.daemon.connect(e) != nil {
		return errors.New("--any-owner needs --direct: through roched each tenant sees only its own sandboxes")
	}
	return nil
}
