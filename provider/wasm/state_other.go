//go:build !unix

package wasm

import (
	"errors"
	"os"
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
