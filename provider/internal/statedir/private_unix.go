//go:build unix

package statedir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ReadPrivate reads a file this process's user wrote for itself (a cache under a
// provider's state directory), or refuses it: it must be a regular file reached without
// following a link, owned by this user, with one name and no permission for anyone else,
// in a directory that only this user or root may change (Check), and at most limit
// bytes. What a provider trusts from such a cache (crun's compiled seccomp filter, which
// replaces Roche's filter in a sandbox; a runtime probe's verdict; python.wasm's
// verified digest) must be something another local user could not have written.
func ReadPrivate(path string, limit int64) ([]byte, error) {
	if err := Check(filepath.Dir(path)); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%s is not a regular file", path)
	case st.Uid != uint32(os.Geteuid()):
		return nil, fmt.Errorf("%s belongs to uid %d, not this process's %d", path, st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return nil, fmt.Errorf("%s has mode %#o: others may read or write it", path, st.Mode&0o777)
	case st.Nlink != 1:
		return nil, fmt.Errorf("%s has %d links", path, st.Nlink)
	case st.Size > limit:
		return nil, fmt.Errorf("%s holds %d bytes, more than %d", path, st.Size, limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errors.New(path + " grew while read")
	}
	return b, nil
}

// WritePrivate replaces path with b, mode 0600, through a temporary file renamed into
// place, so that a reader never sees it half written.
func WritePrivate(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
