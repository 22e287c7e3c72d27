//go:build !unix

package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// runFull runs the full binary as a child where a process cannot replace itself, with
// this process's streams, and exits as it did.
func runFull(path string, argv []string) error {
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args = argv
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit):
		return exitCode(exit.ExitCode())
	}
	return handoffError{fmt.Errorf("running %s: %w", path, err)}
}
