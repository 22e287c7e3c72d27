//go:build !unix

package daemon

import "io/fs"

// checkFileOwner has no owner to check here; the mode check stands alone.
func checkFileOwner(fs.FileInfo, string, string) error { return nil }

// lockState has no flock here: one daemon per state file is the operator's to keep.
func lockState(string) (func(), error) { return func() {}, nil }
