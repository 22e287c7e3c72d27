package cli

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/catalog"
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

// directHint adds to roched's "not found" for a sandbox id what this roche finds of it
// in direct mode: one of the caller's own, made in direct mode, that roched does not
// serve them (roched serves only its own user's, --direct-owner, on its socket; one
// over --address serves none), with the flag that reaches it. Only the full roche can
// look (the thin one has no provider in-process); any other error is returned as it is.
func (e *env) directHint(err error) error {
	if !errors.Is(err, roche.ErrNotFound) || e.local == nil || e.daemon == nil {
		return err
	}
	e.providers.mu.Lock()
	ids := maps.Clone(e.providers.viaDaemon)
	e.providers.mu.Unlock()
	for id, name := range ids {
		p, oerr := e.local.Open(name, e.providers.options())
		if oerr != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sb, ierr := p.Inspect(ctx, id)
		cancel()
		_ = catalog.Set{name: p}.Close()
		if ierr != nil || sb.Owner != e.owner() {
			continue
		}
		where := "on " + e.daemon.socket + " serves its own user's (roched --direct-owner) to that user alone"
		if e.daemon.remote.address != "" {
			where = "at " + e.daemon.remote.address + " serves none made here"
		}
		return fmt.Errorf("%w; sandbox %s is one you made in direct mode (owner %s), and roched %s: pass --direct to reach it",
			err, sb.ID, sb.Owner, where)
	}
	return err
}
