package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/wire"
)

// What one client asks for must not decide roched's memory. ExecStream passes output on
// as it comes and keeps none (roche.ExecRequest.StreamOnly). A unary Exec's result
// carries its output whole, so that output is held until the response is written: each
// call asks for at most wire.MaxExecOutput per stream, and all calls together hold at
// most maxHeldOutput; output past it is cut and flagged truncated, never buffered.
const maxHeldOutput = 128 << 20

// outputBudget is what is left of maxHeldOutput.
type outputBudget struct {
	mu   sync.Mutex
	left int64
}

// take grants up to n bytes.
func (b *outputBudget) take(n int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, b.left)
	b.left -= n
	return n
}

func (b *outputBudget) give(n int64) {
	b.mu.Lock()
	b.left += n
	b.mu.Unlock()
}

// heldBytes counts what one HTTP request's handlers took from the budget; it is given
// back once the response has been written (releaseHeld), not when the handler returns,
// so a client that reads its response slowly still counts.
type heldBytes struct {
	mu sync.Mutex
	n  int64
}

type heldKey struct{}

// releaseHeld gives back, after each request's response is written, what its handler
// took from the output budget.
func (d *Daemon) releaseHeld(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := &heldBytes{}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), heldKey{}, h)))
		d.output.give(h.n)
	})
}

// heldOutput keeps one stream of a unary Exec's output within the budget.
type heldOutput struct {
	d     *Daemon
	held  *heldBytes
	buf   []byte
	short bool // the budget ran out: bytes were dropped
}

// newHeldOutputs returns the two streams of one unary Exec and the function to call once
// the result is built when no request context carries a heldBytes (the release is then
// at the handler's return).
func (d *Daemon) newHeldOutputs(ctx context.Context) (stdout, stderr *heldOutput, done func()) {
	h, ok := ctx.Value(heldKey{}).(*heldBytes)
	done = func() {}
	if !ok {
		h = &heldBytes{}
		done = func() { d.output.give(h.n) }
	}
	return &heldOutput{d: d, held: h}, &heldOutput{d: d, held: h}, done
}

// Write keeps what the budget grants and drops the rest; it never fails, so the command
// is not disturbed. The provider's capture calls it serially, within the output limit.
func (o *heldOutput) Write(p []byte) (int, error) {
	n := o.d.output.take(int64(len(p)))
	o.held.mu.Lock()
	o.held.n += n
	o.held.mu.Unlock()
	o.buf = append(o.buf, p[:n]...)
	if n < int64(len(p)) && !o.short {
		o.short = true
		o.d.log.Warn("unary Exec output cut: roched holds at most this much unary output at once; use ExecStream",
			"limit", size.String(maxHeldOutput))
	}
	return len(p), nil
}

// uploadLimit refuses a CopyTo upload once it passes max bytes (wire.MaxUploadBytes),
// before more of it reaches the daemon's disk.
type uploadLimit struct{ max int64 }

func (uploadLimit) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }

func (uploadLimit) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (u uploadLimit) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, &countingConn{StreamingHandlerConn: conn, max: u.max})
	}
}

type countingConn struct {
	connect.StreamingHandlerConn
	n, max int64
}

func (c *countingConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return cutShort(err)
	}
	if m, ok := msg.(*rochev1.CopyToRequest); ok {
		c.n += int64(len(m.TarChunk))
		if c.n > c.max {
			return wire.ToStatus(fmt.Errorf("%w: the upload is over the limit of %s per copy into a sandbox: copy less at once",
				roche.ErrInvalidConfig, size.String(c.max)))
		}
	}
	return nil
}

// cutShort makes a request that ended mid-message (an envelope whose prefix or body was
// cut short) the caller's error, INVALID_ARGUMENT, where connect reports it as
// INTERNAL, a fault of the server's. Whatever cut it (a client that sent half a message,
// or went away), roched did nothing wrong.
func cutShort(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() == connect.CodeInternal && strings.HasPrefix(ce.Message(), "protocol error:") {
		return connect.NewError(connect.CodeInvalidArgument,
			fmt.Errorf("%w: the request ended mid-message (%s): send whole messages", roche.ErrInvalidConfig, ce.Message()))
	}
	return err
}
