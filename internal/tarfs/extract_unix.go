//go:build unix

package tarfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Extract reads a tar stream whose entries share one root entry and recreates that root
// at the host path dst (the root's own name is replaced by dst's). The directories of
// dst's parent path are taken as given, and created if missing; nothing at or below dst
// is ever followed (see the package doc).
func Extract(r io.Reader, dst string, opts Options) (Report, error) {
	dst, err := filepath.Abs(dst)
	if err != nil {
		return Report{}, err
	}
	if dst == string(filepath.Separator) {
		return Report{}, fmt.Errorf("%w: the destination cannot be /: name a file or directory to create", ErrUnsafe)
	}
	parent := filepath.Dir(dst)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Report{}, err
	}
	dir, err := os.Open(parent)
	if err != nil {
		return Report{}, err
	}
	defer dir.Close()
	return ExtractAt(r, dir, filepath.Base(dst), opts)
}

// ExtractAt is Extract with the destination named by rel (slash-separated, no "..")
// below the open directory dir. Missing directories along rel are created; symlinks
// along it are replaced, never followed.
func ExtractAt(r io.Reader, dir *os.File, rel string, opts Options) (Report, error) {
	var prefix []string
	for _, p := range strings.Split(filepath.ToSlash(rel), "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return Report{}, fmt.Errorf("%w: destination %q climbs with \"..\"", ErrUnsafe, rel)
		}
		prefix = append(prefix, p)
	}
	if len(prefix) == 0 {
		return Report{}, fmt.Errorf("%w: destination %q names no file or directory below %s", ErrUnsafe, rel, dir.Name())
	}
	x := &extractor{
		checker: checker{opts: opts},
		base:    int(dir.Fd()),
		display: dir.Name(),
		prefix:  prefix,
		cached:  -1,
		buf:     make([]byte, 256<<10),
	}
	defer x.uncache()
	// A copy that fails part way (over its limit, a broken stream, no space) takes back
	// the destination it made, so that no half-written copy is left looking whole. One
	// that was already there keeps what it had and what was written before the failure.
	parent, err := x.dirOf(prefix[:len(prefix)-1])
	if err != nil {
		return Report{}, err
	}
	name := prefix[len(prefix)-1]
	var st unix.Stat_t
	made := errors.Is(unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW), unix.ENOENT)
	err = x.run(r)
	if err != nil && made {
		x.uncache()
		if parent, derr := x.dirOf(prefix[:len(prefix)-1]); derr == nil {
			removeAllAt(parent, name)
		}
	}
	// The descriptor must outlive every *at call made on it.
	runtime.KeepAlive(dir)
	return x.rep, err
}

// removeAllAt removes name in dirfd and, when it is a directory, everything below it,
// without following a symlink anywhere. Errors are ignored: it undoes what a failed
// copy made, and that copy's error is the one to report.
func removeAllAt(dirfd int, name string) {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || !(errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM)) {
		return
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	d := os.NewFile(uintptr(fd), name)
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		removeAllAt(fd, n)
	}
	d.Close()
	unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

type extractor struct {
	checker
	base    int      // the directory the destination is below
	display string   // base's path, for messages
	prefix  []string // the destination below base
	// cached is an open directory reused while entries keep landing in it.
	cached    int
	cachedKey string
	buf       []byte
}

func (x *extractor) run(r io.Reader) error {
	tr := tar.NewReader(r)
	seen := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if !seen {
				return ErrEmpty
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", err)
		}
		seen = true
		rest, skip, err := x.check(hdr)
		if err != nil {
			return err
		}
		if skip {
			continue
		}
		full := append(append([]string{}, x.prefix...), rest...)
		parent, err := x.dirOf(full[:len(full)-1])
		if err != nil {
			return err
		}
		name, shown := full[len(full)-1], x.show(full)
		switch hdr.Typeflag {
		case tar.TypeDir:
			fd, err := openDir(parent, name, uint32(hdr.Mode&0o777)|0o700, shown)
			if err != nil {
				return err
			}
			unix.Close(fd)
		case tar.TypeSymlink:
			if err := removeNonDir(parent, name, shown); err != nil {
				return err
			}
			if err := unix.Symlinkat(hdr.Linkname, parent, name); err != nil {
				return &fs.PathError{Op: "symlink", Path: shown, Err: err}
			}
		default:
			if err := x.writeFile(parent, name, shown, tr, hdr); err != nil {
				return err
			}
		}
		x.counted(hdr)
	}
}

func (x *extractor) show(parts []string) string {
	return filepath.Join(append([]string{x.display}, parts...)...)
}

// dirOf returns an open descriptor of the directory parts (below base), walking and
// creating it without following symlinks. The descriptor stays owned by the extractor.
func (x *extractor) dirOf(parts []string) (int, error) {
	if len(parts) == 0 {
		return x.base, nil
	}
	key := strings.Join(parts, "/")
	if x.cached >= 0 && key == x.cachedKey {
		return x.cached, nil
	}
	x.uncache()
	cur := x.base
	for i, p := range parts {
		fd, err := openDir(cur, p, 0o755, x.show(parts[:i+1]))
		if cur != x.base {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		cur = fd
	}
	x.cached, x.cachedKey = cur, key
	return cur, nil
}

func (x *extractor) uncache() {
	if x.cached >= 0 {
		unix.Close(x.cached)
		x.cached, x.cachedKey = -1, ""
	}
}

// openDir opens the directory name in dirfd without following a symlink, making it
// (with mode) when missing. A symlink there is removed and replaced by the directory:
// the archive says a directory belongs there, and writing through a link is what must
// never happen. Anything else there is an error.
func openDir(dirfd int, name string, mode uint32, shown string) (int, error) {
	for range 5 {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			return fd, nil
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(dirfd, name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, &fs.PathError{Op: "mkdir", Path: shown, Err: err}
			}
			continue
		}
		if !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
			return -1, &fs.PathError{Op: "open", Path: shown, Err: err}
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return -1, &fs.PathError{Op: "stat", Path: shown, Err: err}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			return -1, fmt.Errorf("%w: %s exists and the archive has a directory there", ErrNotDir, shown)
		}
		if err := unix.Unlinkat(dirfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return -1, &fs.PathError{Op: "remove symlink", Path: shown, Err: err}
		}
	}
	return -1, fmt.Errorf("%s kept changing while the copy was creating it", shown)
}

// removeNonDir removes whatever non-directory is at name (a symlink is removed, never
// followed), so that a new file or link can take its place.
func removeNonDir(dirfd int, name, shown string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.EPERM):
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return fmt.Errorf("%w: %s is a directory and the archive has a file there", ErrIsDir, shown)
		}
	}
	return &fs.PathError{Op: "remove", Path: shown, Err: err}
}

// writeFile creates name afresh (whatever was there, a symlink included, is removed
// first) and writes the entry's content, keeping all-zero blocks as holes.
func (x *extractor) writeFile(dirfd int, name, shown string, r io.Reader, hdr *tar.Header) error {
	var fd int
	for attempt := 0; ; attempt++ {
		if err := removeNonDir(dirfd, name, shown); err != nil {
			return err
		}
		var err error
		fd, err = unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(hdr.Mode&0o777))
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || attempt == 3 {
			return &fs.PathError{Op: "create", Path: shown, Err: err}
		}
	}
	f := os.NewFile(uintptr(fd), shown)
	err := writeSparse(f, r, hdr.Size, x.buf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", shown, err)
	}
	return nil
}

// holeBlock is the granularity at which runs of zeros become holes.
const holeBlock = 4096

var zeros = make([]byte, holeBlock)

// writeSparse writes size bytes of r to the new, empty file f, seeking over every
// all-zero block instead of writing it, then sets the size: a sparse file stays sparse
// and a file of zeros takes no disk.
func writeSparse(f *os.File, r io.Reader, size int64, buf []byte) error {
	var off int64
	for off < size {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		data := buf[:n]
		for i := 0; i < n; {
			end := min(i+holeBlock, n)
			if bytes.Equal(data[i:end], zeros[:end-i]) {
				i = end
				continue
			}
			j := end
			for j < n {
				e := min(j+holeBlock, n)
				if bytes.Equal(data[j:e], zeros[:e-j]) {
					break
				}
				j = e
			}
			if _, werr := f.WriteAt(data[i:j], off+int64(i)); werr != nil {
				return werr
			}
			i = j
		}
		off += int64(n)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return f.Truncate(size)
}
