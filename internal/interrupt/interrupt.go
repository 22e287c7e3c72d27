// Package interrupt gives a command a context that its first Ctrl-C or SIGTERM cancels,
// so that it stops and destroys what it made instead of dying with sandboxes alive, and
// exits at once at the second: the user insists. The CLI and the benches share it.
package interrupt

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Signal is the cause of a context a signal cancelled.
type Signal struct{ os.Signal }

func (s Signal) Error() string { return s.Signal.String() }

// Is makes an interruption context.Canceled to errors.Is, as code that checks for a
// cancelled context expects (Go's HTTP client reports the cause itself).
func (s Signal) Is(target error) bool { return target == context.Canceled }

// ExitCode is 130 for SIGINT and 128 + n for any other signal n (143 for SIGTERM), as
// shells report a process a signal ended.
func (s Signal) ExitCode() int {
	if n, ok := s.Signal.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 128 + int(syscall.SIGINT)
}

// Context returns a context that the first SIGINT or SIGTERM, or the first of extra (a
// bench adds SIGPIPE: its output piped into head, which closed it), cancels with Signal
// as its cause. A second SIGINT or SIGTERM writes "prog: SIG again: ..." to stderr and
// exits with its ExitCode, cleanup or not; more of extra are ignored. stop releases the
// signals and cancels the context.
func Context(stderr io.Writer, prog string, extra ...os.Signal) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, append([]os.Signal{os.Interrupt, syscall.SIGTERM}, extra...)...)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			cancel(Signal{sig})
		case <-done:
			return
		}
		for {
			select {
			case sig := <-sigs:
				if sig != os.Interrupt && sig != syscall.SIGTERM {
					continue // a later write to a closed stdout, say
				}
				fmt.Fprintf(stderr, "%s: %s again: exiting without finishing cleanup (roche gc removes leftovers)\n", prog, sig)
				os.Exit(Signal{sig}.ExitCode())
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
