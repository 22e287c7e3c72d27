package daemon

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Leases through the API: a client that creates a sandbox with leased=true holds it with
// a Hold stream for as long as it wants it. The stream ends when the client lets go or
// its process dies (the kernel closes its connection); what then happens to the sandbox
// is the ledger's (internal/ledger lease.go).

// holdHeartbeat is how often a Hold stream sends, so that a dead client is noticed.
const holdHeartbeat = 15 * time.Second

// Hold holds a leased sandbox until the client goes.
func (s *service) Hold(ctx context.Context, req *connect.Request[rochev1.HoldRequest], stream *connect.ServerStream[rochev1.HoldResponse]) error {
	t, err := tenantOf(ctx)
	if err != nil {
		return wire.ToStatus(err)
	}
	id, release, err := s.d.ledger.Hold(t, req.Msg.SandboxId)
	if err != nil {
		return wire.ToStatus(err)
	}
	defer release()
	tick := time.NewTicker(holdHeartbeat)
	defer tick.Stop()
	for {
		if !s.d.ledger.Live(id) {
			// Destroyed, or its lifetime ended.
			return wire.ToStatus(ledger.NotFound(id))
		}
		if err := stream.Send(&rochev1.HoldResponse{}); err != nil {
			return nil // the client is gone
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.d.draining:
			return wire.ToStatus(fmt.Errorf("%w: roched is shutting down", roche.ErrUnavailable))
		case <-tick.C:
		}
	}
}
