//go:build !unix

package wasm

import (
	"errors"
	"os"
	"sync"
)

// checkPrivateDir checks only that dir is a directory: ownership is a Unix notion, and
// elsewhere the per-user temporary directory is already private.
func checkPrivateDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	return nil
}

// dataLock stands in for a file lock where there is no flock(2): it excludes other
// callers in this process only.
var dataLock sync.Mutex

// lockFile takes the process-wide data lock; path is not used.
func lockFile(string) (func(), error) {
	dataLock.Lock()
	return dataLock.Unlock, nil
}
