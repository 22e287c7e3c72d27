//go:build unix

package wasm

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// checkPrivateDir makes sure dir is a directory owned by the current user that no one
// else can enter, tightening its mode if it is ours but too open.
func checkPrivateDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Getuid(); int(st.Uid) != uid {
		return fmt.Errorf("owned by uid %d, not by the current user (uid %d)", st.Uid, uid)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("making it private (mode 0700): %v", err)
		}
	}
	return nil
}

// lockFile takes an exclusive lock on the file at path, creating it, and returns what
// releases it. flock(2) locks belong to the open file, so the lock excludes other
// processes and other callers in this one alike.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
