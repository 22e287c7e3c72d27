//go:build unix

package cli

import (
	"fmt"
	"os"
	"syscall"
)

// runFull replaces this process with the full binary: the caller (a shell, an SDK)
// sees one process, its pid, signals and exit status, as if roche had run the command.
func runFull(path string, argv []string) error {
	err := syscall.Exec(path, argv, os.Environ())
	return handoffError{fmt.Errorf("running %s: %w", path, err)}
}
