package samples

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Interruptible is a context that Ctrl-C, SIGTERM or a closed stdout (SIGPIPE: the bench
// piped into head) cancels, so that the bench stops measuring and destroys what it made
// instead of dying with its sandboxes alive until their lifetimes end. Cleanups use
// context.WithoutCancel of it. A second Ctrl-C or SIGTERM exits at once. stop releases the signals.
func Interruptible() (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			cancel(fmt.Errorf("interrupted by %v: destroying what the bench made", sig))
		case <-done:
			return
		}
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGPIPE {
					continue // every later write to the closed stdout
				}
				fmt.Fprintf(os.Stderr, "bench: %v again: exiting without cleanup (roche gc removes leftovers)\n", sig)
				os.Exit(130)
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}
