package daemon

import (
	"context"
	"errors"
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

// holdHeartbeat is how often a Hold stream sends, so that a dead client is noticed;
// holdCheck how often it looks whether its sandbox still lives, so that a sandbox
// destroyed under its holder (another client's destroy, its lifetime's end, its engine)
// ends the stream within about a second, saying why.
const (
	holdHeartbeat = 15 * time.Second
	holdCheck     = time.Second
)

// Hold holds a leased sandbox until the client goes.
func (s *service) Hold(ctx context.Context, req *connect.Request[rochev1.HoldRequest], stream *connect.ServerStream[rochev1.HoldResponse]) error {
	t, err := tenantOf(ctx)
	if err != nil {
		return wire.ToStatus(err)
	}
	id, release, err := s.d.ledger.Hold(t, req.Msg.SandboxId)
	if err != nil {
		if errors.Is(err, roche.ErrNotFound) {
			err = s.d.ledger.WhyNotHeld(t, req.Msg.SandboxId, err)
		}
		return wire.ToStatus(err)
	}
	defer release()
	check := time.NewTicker(holdCheck)
	defer check.Stop()
	var lastSent time.Time
	var last ledger.Record
	for {
		if err := s.d.ledger.HeldGone(t, id, &last); err != nil {
			// Its last message says why it ended, where roched knows.
			if sb, ok := s.d.ledger.InspectEnded(t, id); ok {
				_ = stream.Send(&rochev1.HoldResponse{End: wire.EndToProto(sb.End)})
			}
			return wire.ToStatus(err)
		}
		if time.Since(lastSent) >= holdHeartbeat {
			if err := stream.Send(&rochev1.HoldResponse{}); err != nil {
				return nil // the client is gone
			}
			lastSent = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.d.draining:
			return wire.ToStatus(fmt.Errorf("%w: roched is shutting down", roche.ErrUnavailable))
		case <-check.C:
		}
	}
}
