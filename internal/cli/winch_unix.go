//go:build unix

package cli

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/roche-sandbox/roche"
)

// watchWindow sends the terminal's new size on every SIGWINCH until stop is called.
func watchWindow(f *os.File) (<-chan roche.TerminalSize, func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGWINCH)
	out := make(chan roche.TerminalSize, 1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sigs:
				select {
				case out <- windowSize(f):
				case <-done:
					return
				}
			case <-done:
				return
			}
		}
	}()
	return out, func() {
		signal.Stop(sigs)
		close(done)
	}
}
