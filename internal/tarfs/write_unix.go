//go:build unix

package tarfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Write writes the host file or directory src as a tar stream whose root entry is named
// name. The directories of src's parent path are taken as given; src itself and
// everything below it are opened without following symlinks (a symlink is sent as a
// symlink, never read through) and described by fstat of what was opened, so nothing
// outside src is read even while its contents change.
func Write(w io.Writer, src, name string, opts Options) (Report, error) {
	src, err := filepath.Abs(src)
	if err != nil {
		return Report{}, err
	}
	parent, base := filepath.Dir(src), filepath.Base(src)
	if src == string(filepath.Separator) {
		base = "."
	}
	dir, err := os.Open(parent)
	if err != nil {
		return Report{}, err
	}
	defer dir.Close()
	return WriteAt(w, dir, base, name, opts)
}

// WriteAt is Write with the source named by rel (slash-separated, no "..") below the open
// directory dir; a symlink anywhere along rel is refused rather than followed.
func WriteAt(w io.Writer, dir *os.File, rel, name string, opts Options) (Report, error) {
	var parts []string
	for _, p := range strings.Split(filepath.ToSlash(rel), "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return Report{}, fmt.Errorf("%w: source %q climbs with \"..\"", ErrUnsafe, rel)
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		parts = []string{"."}
	}
	x := &writer{tw: tar.NewWriter(w), opts: opts, root: name}
	base := int(dir.Fd())
	defer runtime.KeepAlive(dir)
	cur, shown := base, dir.Name()
	closeCur := func() {
		if cur != base {
			unix.Close(cur)
		}
	}
	defer func() { closeCur() }()
	for _, p := range parts[:len(parts)-1] {
		shown = filepath.Join(shown, p)
		fd, err := unix.Openat(cur, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			var st unix.Stat_t
			if (errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)) &&
				unix.Fstatat(cur, p, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return x.rep, fmt.Errorf("%w: %s is a symlink, which a copy does not follow", ErrUnsafe, shown)
			}
			return x.rep, &fs.PathError{Op: "open", Path: shown, Err: err}
		}
		closeCur()
		cur = fd
	}
	last := parts[len(parts)-1]
	if err := x.entry(cur, last, name, filepath.Join(shown, last)); err != nil {
		return x.rep, err
	}
	return x.rep, x.tw.Close()
}

type writer struct {
	tw   *tar.Writer
	opts Options
	rep  Report
	root string // the root entry's name: a missing root is an error, not a skip
}

// entry sends child of the open directory dirfd, and for a directory everything below
// it, as archive entries named arc.
func (x *writer) entry(dirfd int, child, arc, shown string) error {
	// A few tries: the sandbox may be swapping the entry while we look at it; each try
	// describes what was actually opened, so a lost race is a retry, never a followed link.
	for range 4 {
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, child, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) && arc != x.root {
				return nil // removed since its directory was listed: as tar does, go on without it
			}
			return &fs.PathError{Op: "lstat", Path: shown, Err: err}
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := readlinkat(dirfd, child)
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue // no longer a symlink
			}
			if err != nil {
				return &fs.PathError{Op: "readlink", Path: shown, Err: err}
			}
			x.rep.Links++
			return x.tw.WriteHeader(&tar.Header{
				Typeflag: tar.TypeSymlink, Name: arc, Linkname: target, Mode: 0o777,
				ModTime: time.Unix(st.Mtim.Unix()),
			})
		case unix.S_IFREG, unix.S_IFDIR:
		default:
			// Devices, fifos and sockets are not copied; not even opened, which for a
			// device could do something.
			x.rep.skip(arc, "", ReasonSpecial)
			return nil
		}
		fd, err := unix.Openat(dirfd, child, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOENT) {
			continue // swapped for a symlink (or removed) since the stat
		}
		if err != nil {
			return &fs.PathError{Op: "open", Path: shown, Err: err}
		}
		f := os.NewFile(uintptr(fd), shown)
		err = x.opened(f, arc, shown)
		f.Close()
		return err
	}
	return fmt.Errorf("%s kept changing while it was copied", shown)
}

// opened sends the file or directory f, which was opened without following a symlink.
func (x *writer) opened(f *os.File, arc, shown string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	mode := int64(fi.Mode().Perm())
	switch {
	case fi.Mode().IsRegular():
		size := fi.Size()
		if x.opts.MaxBytes > 0 && size > x.opts.MaxBytes-x.rep.Bytes {
			return &LimitError{Name: shown, Size: size, Limit: x.opts.MaxBytes}
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: arc, Size: size, Mode: mode, ModTime: fi.ModTime()}
		if err := x.tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.CopyN(x.tw, f, size); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s shrank while it was copied", shown)
			}
			return err
		}
		x.rep.Files++
		x.rep.Bytes += size
		return nil
	case fi.IsDir():
		if err := x.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: arc + "/", Mode: mode, ModTime: fi.ModTime()}); err != nil {
			return err
		}
		x.rep.Dirs++
		names, err := f.Readdirnames(-1)
		if err != nil {
			return fmt.Errorf("listing %s: %w", shown, err)
		}
		sort.Strings(names)
		fd := int(f.Fd())
		for _, n := range names {
			if err := x.entry(fd, n, arc+"/"+n, filepath.Join(shown, n)); err != nil {
				return err
			}
		}
		return nil
	}
	x.rep.skip(arc, "", ReasonSpecial)
	return nil
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
