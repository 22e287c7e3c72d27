package client

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche/internal/wire"
)

// Retries. A call that is safe to repeat (a read, a destroy, a create or an exec with an
// idempotency key) is repeated when its connection to roched was lost, with backoff, for
// up to RetryFor: a roched restarting, or a replica of a group dying behind a Service
// that sends the next connection to another. An answer from roched, whatever it says,
// is never retried.
const (
	// RetryFor bounds the retries of one call.
	RetryFor      = 30 * time.Second
	retryFirst    = 100 * time.Millisecond
	retryMaxDelay = 2 * time.Second
)

// retryable reports whether err says the call never reached roched (the connection
// refused, only once this client has reached roched before: a roched that was never
// there is not waited for) or lost it on the way, rather than that roched answered.
func (c *Client) retryable(err error) bool {
	if connectionLost(err) {
		return true
	}
	var ce *connect.Error
	if !errors.As(err, &ce) || !c.reached.Load() {
		return false
	}
	if _, withDetail := wire.FromStatus(ce); withDetail {
		return false
	}
	var op *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &op)
}

// retrying runs call until it returns anything but a lost connection, ctx ends or
// RetryFor has passed; retried says whether an earlier attempt may have reached roched.
func retrying[T any](ctx context.Context, c *Client, call func(retried bool) (T, error)) (T, error) {
	deadline := time.Now().Add(RetryFor)
	delay := retryFirst
	retried := false
	for {
		v, err := call(retried)
		if err == nil {
			c.reached.Store(true)
		}
		if err == nil || !c.retryable(err) || time.Now().Add(delay).After(deadline) {
			return v, err
		}
		retried = true
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(delay):
		}
		delay = min(delay*2, retryMaxDelay)
	}
}
