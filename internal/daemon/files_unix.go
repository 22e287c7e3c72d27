//go:build unix

package daemon

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/roche-sandbox/roche"
)

// checkFileOwner refuses a secret file owned by someone other than this process's user
// or root: its owner could change it.
func checkFileOwner(fi fs.FileInfo, path, what string) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("%w: %s %s belongs to uid %d, not to roched's user (%d) or root", roche.ErrInvalidConfig, what, path, uid, os.Geteuid())
	}
	return nil
}

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
