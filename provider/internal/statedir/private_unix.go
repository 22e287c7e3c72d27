//go:build unix

package statedir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

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
	f, _, err := openPrivate(path, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errors.New(path + " grew while read")
	}
	return b, nil
}

// MapPrivate is ReadPrivate for a large file its caller keeps: the file mapped
// read-only rather than copied, so that its pages come from the page cache as they are
// touched instead of being faulted into a fresh buffer and copied, and what is kept
// (python.wasm's data, a pre-initialised interpreter's memory) is not on the heap. The
// mapping stays valid when the file is replaced (WritePrivate renames a new one into
// place); m releases it, after which the bytes released must not be touched. An empty
// file maps to an empty slice.
func MapPrivate(path string, limit int64) (b []byte, m *Mapping, err error) {
	f, size, err := openPrivate(path, limit)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if size == 0 {
		return []byte{}, &Mapping{}, nil
	}
	addr, err := unix.MmapPtr(int(f.Fd()), 0, nil, uintptr(size), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, &os.PathError{Op: "mmap", Path: path, Err: err}
	}
	return unsafe.Slice((*byte)(addr), size), &Mapping{addr: addr, size: uintptr(size)}, nil
}

// Mapping is what MapPrivate mapped and has not released. Its methods may be called
// any number of times, from any goroutine.
type Mapping struct {
	mu   sync.Mutex
	addr unsafe.Pointer // the first byte still mapped, page-aligned
	size uintptr
}

// Keep releases the whole pages of the mapping outside part, a piece of it (the data
// after a module wazero has copied what it keeps of), so that Unmap later releases only
// the pages part is on.
func (m *Mapping) Keep(part []byte) {
	if len(part) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	page := uintptr(os.Getpagesize())
	start, end := uintptr(m.addr), uintptr(m.addr)+m.size
	at := uintptr(unsafe.Pointer(unsafe.SliceData(part)))
	from := max(at&^(page-1), start)
	to := min((at+uintptr(len(part))+page-1)&^(page-1), end)
	if m.size == 0 || from >= to {
		return
	}
	if from > start {
		_ = unix.MunmapPtr(m.addr, from-start)
	}
	if to < end {
		_ = unix.MunmapPtr(unsafe.Add(m.addr, to-start), end-to)
	}
	m.addr, m.size = unsafe.Add(m.addr, from-start), to-from
}

// Unmap releases what is left of the mapping.
func (m *Mapping) Unmap() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.size > 0 {
		_ = unix.MunmapPtr(m.addr, m.size)
	}
	m.addr, m.size = nil, 0
}

// openPrivate opens path for ReadPrivate and MapPrivate, after the checks they
// promise, with its size.
func openPrivate(path string, limit int64) (*os.File, int64, error) {
	if err := Check(filepath.Dir(path)); err != nil {
		return nil, 0, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	err = nil
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("%s is not a regular file", path)
	case st.Uid != uint32(os.Geteuid()):
		err = fmt.Errorf("%s belongs to uid %d, not this process's %d", path, st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		err = fmt.Errorf("%s has mode %#o: others may read or write it", path, st.Mode&0o777)
	case st.Nlink != 1:
		err = fmt.Errorf("%s has %d links", path, st.Nlink)
	case st.Size > limit:
		err = fmt.Errorf("%s holds %d bytes, more than %d", path, st.Size, limit)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size, nil
}

// WritePrivate replaces path with the parts of b one after the other, mode 0600,
// through a temporary file renamed into place, so that a reader never sees it half
// written.
func WritePrivate(path string, b ...[]byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	for _, part := range b {
		if err == nil {
			_, err = f.Write(part)
		}
	}
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
