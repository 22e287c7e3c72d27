//go:build !unix

package tarfs

import (
	"errors"
	"io"
	"os"
)

// errPlatform: the descriptor-relative, no-follow walk needs openat and O_NOFOLLOW.
var errPlatform = errors.New("copying files needs a Unix host (openat with O_NOFOLLOW)")

// Write is unsupported off Unix; see write_unix.go.
func Write(w io.Writer, src, name string, opts Options) (Report, error) {
	return Report{}, errPlatform
}

// WriteAt is unsupported off Unix.
func WriteAt(w io.Writer, dir *os.File, rel, name string, opts Options) (Report, error) {
	return Report{}, errPlatform
}

// Extract is unsupported off Unix; see extract_unix.go.
func Extract(r io.Reader, dst string, opts Options) (Report, error) {
	return Report{}, errPlatform
}

// ExtractAt is unsupported off Unix.
func ExtractAt(r io.Reader, dir *os.File, rel string, opts Options) (Report, error) {
	return Report{}, errPlatform
}

// ExtractTree is unsupported off Unix.
func ExtractTree(r io.Reader, dir string, opts TreeOptions) (Report, error) {
	return Report{}, errPlatform
}
