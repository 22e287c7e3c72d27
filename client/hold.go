package client

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// A leased sandbox (roche.Config.Leased) is held by this client with a Hold stream from
// its create until Destroy, Close or the end of this process: the daemon destroys it a
// few seconds after the stream ends. A stream cut while the daemon restarts is taken
// again, for a while.
const (
	holdRetryFor   = 30 * time.Second
	holdRetryDelay = 500 * time.Millisecond
)

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
	for ctx.Err() == nil {
		stream, err := c.rpc.Hold(ctx, connect.NewRequest(&rochev1.HoldRequest{SandboxId: id}))
		if err == nil {
			for stream.Receive() {
				lastHeld = time.Now()
			}
			err = stream.Err()
			stream.Close()
		}
		if ctx.Err() != nil {
			return
		}
		err = c.fromRPC(err)
		if errors.Is(err, roche.ErrNotFound) || errors.Is(err, roche.ErrInvalidConfig) || time.Since(lastHeld) > holdRetryFor {
			c.mu.Lock()
			delete(c.holds, id)
			c.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(holdRetryDelay):
		}
	}
}
