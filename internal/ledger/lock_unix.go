//go:build unix

package ledger

import (
	"fmt"
	"os"
	"syscall"

	"github.com/roche-sandbox/roche"
)

// lockState takes an exclusive lock on the state file's lock file for the daemon's
// lifetime, so that two daemons never serve one state file, and so that sandboxes
// labelled with this state file but another instance are known to be orphans.
func lockState(stateFile string) (func(), error) {
	path := stateFile + ".lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the state lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: another roched uses the state file %s: stop it, or give this one its own --state", roche.ErrUnavailable, stateFile)
	}
	return func() { f.Close() }, nil
}
