package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

// A leased sandbox (CreateFor with kit.CreateOptions.Leased) is held by this client with a Hold stream from
// its create until Destroy, Close or the end of this process: the daemon destroys it a
// few seconds after the stream ends. A stream cut while the daemon restarts is taken
// again, for a while.
const (
	holdRetryFor   = 30 * time.Second
	holdRetryDelay = 500 * time.Millisecond
)

// holdLostKeep bounds how many ended holds Holding remembers; the oldest go first.
const holdLostKeep = 256

// Holding reports on this client's hold of the leased sandbox id: nil while it holds
// it; once the hold ended on its own, why (roche.ErrNotFound: the sandbox was destroyed
// under it, by another client's destroy, its lifetime's end or its engine, which the
// error says, a *roche.EndedError carrying the typed reason where roched sent it;
// roche.ErrUnavailable: the daemon could not be reached again for 30 s).
// A hold this client let go of (Destroy, Close), or never had, is ErrInvalidConfig.
func (c *Client) Holding(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.holds[id]; ok {
		return nil
	}
	if err, ok := c.lost[id]; ok {
		return err
	}
	return fmt.Errorf("%w: this client does not hold sandbox %s (not leased, not made by it, or let go of)", roche.ErrInvalidConfig, id)
}

// holdEnded records why the hold of id ended on its own, if ctx is still that hold's.
func (c *Client) holdEnded(ctx context.Context, id string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ctx.Err() != nil {
		return // let go of meanwhile
	}
	delete(c.holds, id)
	if c.lost == nil {
		c.lost = map[string]error{}
	}
	if _, ok := c.lost[id]; !ok {
		c.lostOrder = append(c.lostOrder, id)
	}
	c.lost[id] = err
	for len(c.lostOrder) > holdLostKeep {
		delete(c.lost, c.lostOrder[0])
		c.lostOrder = c.lostOrder[1:]
	}
}

// hold starts holding sandbox id.
func (c *Client) hold(id string) {
	ctx, cancel := context.WithCancel(context.Background())
	c.mu.Lock()
	if c.holds == nil {
		c.holds = map[string]context.CancelFunc{}
	}
	if old, ok := c.holds[id]; ok {
		old()
	}
	c.holds[id] = cancel
	c.mu.Unlock()
	go c.keepHolding(ctx, id)
}

// release stops holding sandbox id, if this client holds it, and reports whether it did.
func (c *Client) release(id string) bool {
	c.mu.Lock()
	cancel, ok := c.holds[id]
	delete(c.holds, id)
	c.mu.Unlock()
	if ok {
		cancel()
	}
	return ok
}

// releaseAll stops every hold (Close): the daemon destroys those sandboxes shortly.
func (c *Client) releaseAll() {
	c.mu.Lock()
	holds := c.holds
	c.holds = nil
	c.mu.Unlock()
	for _, cancel := range holds {
		cancel()
	}
}

// keepHolding holds id until ctx ends, the daemon says the sandbox is gone, or the
// daemon cannot be reached again within holdRetryFor.
func (c *Client) keepHolding(ctx context.Context, id string) {
	lastHeld := time.Now()
	var end *roche.EndReason
	for ctx.Err() == nil {
		stream, err := c.rpc.Hold(ctx, connect.NewRequest(&rochev1.HoldRequest{SandboxId: id}))
		if err == nil {
			for stream.Receive() {
				lastHeld = time.Now()
				if e := stream.Msg().GetEnd(); e != nil {
					end = wire.EndFromProto(e) // the last message: why it ended
				}
			}
			err = stream.Err()
			stream.Close()
		}
		if ctx.Err() != nil {
			return
		}
		err = c.fromRPC(err)
		if errors.Is(err, roche.ErrNotFound) && end != nil {
			err = &roche.EndedError{ID: id, End: *end, Err: err}
		}
		if errors.Is(err, roche.ErrNotFound) || errors.Is(err, roche.ErrInvalidConfig) {
			c.holdEnded(ctx, id, fmt.Errorf("holding sandbox %s: %w", id, err))
			return
		}
		if time.Since(lastHeld) > holdRetryFor {
			c.holdEnded(ctx, id, fmt.Errorf("%w: holding sandbox %s: roched could not be reached again within %v: %v", roche.ErrUnavailable, id, holdRetryFor, err))
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(holdRetryDelay):
		}
	}
}
