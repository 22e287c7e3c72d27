package samples

import (
	"context"
	"errors"
	"os"
	"syscall"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/interrupt"
)

// Interruptible is a context that Ctrl-C, SIGTERM or a closed stdout (SIGPIPE: the bench
// piped into head) cancels, so that the bench stops measuring and destroys what it made
// instead of dying with its sandboxes alive until their lifetimes end. Cleanups use
// context.WithoutCancel of it. A second Ctrl-C or SIGTERM exits at once. stop releases
// the signals.
func Interruptible() (ctx context.Context, stop func()) {
	return interrupt.Context(os.Stderr, "bench", syscall.SIGPIPE)
}

// DestroyAfter destroys sandbox id after err, a failure between its create and its
// destroy, and returns both errors. The destroy's context is not ctx's cancellation:
// Ctrl-C cancels ctx (and so the step that failed), and the sandbox must still go.
func DestroyAfter(ctx context.Context, p roche.Provider, id string, err error) error {
	return errors.Join(err, p.Destroy(context.WithoutCancel(ctx), id))
}
