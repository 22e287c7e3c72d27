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
	"sort"
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
	x := newExtractor(checker{opts: opts}, dir, prefix)
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

// ExtractTree writes a root filesystem, a tar stream such as a flattened image or a
// container's export, into dir, an existing directory: every entry lands below dir as it
// is named (an absolute name as if relative), with the owner, mode (set-id bits
// included) and modification time the archive gives it (dir itself keeps its own);
// directories get theirs last, so that a read-only one does not stop its own entries
// being written. Symlinks are made as they are, whatever they point at: they are
// resolved inside the sandbox, never here.
// A hard link is made only to a file already written below dir. The walk is Extract's:
// no symlink is ever followed, a name that climbs out with ".." is refused, and so is an
// entry below a symlink the archive itself made. Devices and fifos are made only with
// opts.Devices; otherwise they are skipped, as are sockets.
//
// Keeping owners needs root, unless every owner is the caller. Nothing is taken back on
// failure: dir is the caller's to remove.
func ExtractTree(r io.Reader, dir string, opts TreeOptions) (Report, error) {
	d, err := os.Open(dir)
	if err != nil {
		return Report{}, err
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return Report{}, err
	}
	if !fi.IsDir() {
		return Report{}, fmt.Errorf("%w: %s is not a directory", ErrNotDir, dir)
	}
	x := newExtractor(checker{opts: Options{Links: AllLinks}, tree: &opts}, d, nil)
	defer x.uncache()
	err = x.run(r)
	if err == nil {
		err = x.finishDirs()
	}
	runtime.KeepAlive(d)
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

// extractor writes archive entries below base, a directory it was handed open. Every
// path is walked one component at a time from base, each opened without following a
// symlink, and every file is made afresh (O_EXCL|O_NOFOLLOW) in its open parent: no
// path the kernel resolves ever goes through a link, whoever planted it and whenever.
type extractor struct {
	checker
	base    int      // the directory the destination is below
	display string   // base's path, for messages
	prefix  []string // the destination below base (Extract); none for a tree
	// open holds the directories of the last path walked, each an open descriptor, so
	// that entries landing in the same directory or the one beside it do not walk from
	// base again.
	open []openDir
	// links are the symlinks this archive made (paths below base): an entry below one of
	// them is refused, where one that was there before is replaced.
	links map[string]bool
	// dirs are a tree's directories, whose attributes are set once all is written.
	dirs []dirAttrs
	buf  []byte
}

type openDir struct {
	name string
	fd   int
}

// dirAttrs is what ExtractTree sets on a directory last.
type dirAttrs struct {
	parts []string
	hdr   *tar.Header
}

func newExtractor(c checker, dir *os.File, prefix []string) *extractor {
	return &extractor{
		checker: c,
		base:    int(dir.Fd()),
		display: dir.Name(),
		prefix:  prefix,
		links:   map[string]bool{},
		buf:     make([]byte, 256<<10),
	}
}

func (x *extractor) run(r io.Reader) error {
	tr := tar.NewReader(r)
	seen := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if !seen && x.tree == nil {
				return ErrEmpty
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading archive: %w", malformed(err))
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
			err = x.makeDir(parent, name, shown, full, hdr)
		case tar.TypeSymlink:
			err = x.makeSymlink(parent, name, shown, full, hdr)
		case tar.TypeLink:
			err = x.makeHardLink(parent, name, shown, hdr)
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			err = x.makeNode(parent, name, shown, hdr)
		default:
			err = x.writeFile(parent, name, shown, tr, hdr)
		}
		if err != nil {
			return err
		}
		x.counted(hdr)
	}
}

func (x *extractor) show(parts []string) string {
	return filepath.Join(append([]string{x.display}, parts...)...)
}

// dirOf returns an open descriptor of the directory parts (below base), walking and
// creating it without following symlinks. The descriptor stays the extractor's.
func (x *extractor) dirOf(parts []string) (int, error) {
	keep := 0
	for keep < len(x.open) && keep < len(parts) && x.open[keep].name == parts[keep] {
		keep++
	}
	for len(x.open) > keep {
		unix.Close(x.open[len(x.open)-1].fd)
		x.open = x.open[:len(x.open)-1]
	}
	cur := x.base
	if keep > 0 {
		cur = x.open[keep-1].fd
	}
	for i := keep; i < len(parts); i++ {
		fd, err := x.enterDir(cur, parts[:i+1], 0o755)
		if err != nil {
			return -1, err
		}
		x.open = append(x.open, openDir{parts[i], fd})
		cur = fd
	}
	return cur, nil
}

// uncache closes the directories dirOf keeps open.
func (x *extractor) uncache() {
	for _, d := range x.open {
		unix.Close(d.fd)
	}
	x.open = x.open[:0]
}

// enterDir opens the directory parts names (its last component, in dirfd), on the way
// to an entry below it, without following a symlink, making it (with mode) when
// missing. A symlink there is replaced by the directory, since the archive says a
// directory belongs there and writing through a link is what must never happen; unless
// this archive made the link, which only an archive built to write through it does.
// Anything else there is an error.
func (x *extractor) enterDir(dirfd int, parts []string, mode uint32) (int, error) {
	name, shown := parts[len(parts)-1], x.show(parts)
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
		if x.links[strings.Join(parts, "/")] {
			return -1, fmt.Errorf("%w: %s is a symbolic link the archive made, and a later entry is below it", ErrUnsafe, shown)
		}
		if err := unix.Unlinkat(dirfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return -1, &fs.PathError{Op: "remove symlink", Path: shown, Err: err}
		}
	}
	return -1, fmt.Errorf("%s kept changing while the copy was creating it", shown)
}

// makeDir makes the directory entry name in dirfd. In a copy it is made with the
// archive's mode and at least the owner's rwx, and a file already there is an error (it
// is the caller's); in a tree it is made private, its attributes set last, and whatever
// non-directory an earlier entry left there is replaced, as tar does.
func (x *extractor) makeDir(dirfd int, name, shown string, full []string, hdr *tar.Header) error {
	mode := uint32(hdr.Mode&0o777) | 0o700
	if x.tree != nil {
		mode = 0o700
		x.dirs = append(x.dirs, dirAttrs{full, hdr})
	}
	for range 5 {
		err := unix.Mkdirat(dirfd, name, mode)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return &fs.PathError{Op: "mkdir", Path: shown, Err: err}
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return &fs.PathError{Op: "stat", Path: shown, Err: err}
		}
		switch {
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			return nil
		case st.Mode&unix.S_IFMT != unix.S_IFLNK && x.tree == nil:
			return fmt.Errorf("%w: %s exists and the archive has a directory there", ErrNotDir, shown)
		}
		// A symlink (never written through), or in a tree an earlier entry's file.
		if err := unix.Unlinkat(dirfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return &fs.PathError{Op: "remove", Path: shown, Err: err}
		}
	}
	return fmt.Errorf("%s kept changing while the copy was creating it", shown)
}

// makeSymlink makes the symlink entry name in dirfd, in place of whatever non-directory
// was there (a link is replaced, not followed), and remembers it made it.
func (x *extractor) makeSymlink(dirfd int, name, shown string, full []string, hdr *tar.Header) error {
	for attempt := 0; ; attempt++ {
		err := unix.Symlinkat(hdr.Linkname, dirfd, name)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || attempt == 3 {
			return &fs.PathError{Op: "symlink", Path: shown, Err: err}
		}
		if err := x.removeNonDir(dirfd, name, shown, x.tree != nil); err != nil {
			return err
		}
	}
	x.links[strings.Join(full, "/")] = true
	if x.tree != nil {
		if err := unix.Fchownat(dirfd, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &fs.PathError{Op: "lchown", Path: shown, Err: err}
		}
	}
	return nil
}

// makeHardLink links name in dirfd to the file the entry names, found below base by the
// same walk, which must already be there: a link can only join two names of the tree.
func (x *extractor) makeHardLink(dirfd int, name, shown string, hdr *tar.Header) error {
	target, err := treeName(hdr.Linkname)
	if err != nil || len(target) == 0 {
		return fmt.Errorf("%w: hard link %s to %q, which is not a file of the archive", ErrUnsafe, shown, hdr.Linkname)
	}
	tdir, err := x.lookupDir(target[:len(target)-1])
	if err != nil {
		return fmt.Errorf("hard link %s to %s: %w", shown, hdr.Linkname, err)
	}
	defer func() {
		if tdir != x.base {
			unix.Close(tdir)
		}
	}()
	if err := x.removeNonDir(dirfd, name, shown, true); err != nil {
		return err
	}
	// Flags 0: a target that is a symlink is linked as the link itself, not followed.
	if err := unix.Linkat(tdir, target[len(target)-1], dirfd, name, 0); err != nil {
		return &fs.PathError{Op: "link", Path: shown, Err: err}
	}
	return nil
}

// lookupDir opens the existing directory parts below base without following a symlink
// or making anything; the caller closes it (unless it is base).
func (x *extractor) lookupDir(parts []string) (int, error) {
	cur := x.base
	for i, p := range parts {
		fd, err := unix.Openat(cur, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if cur != x.base {
			unix.Close(cur)
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%w: %s is not a directory (a symbolic link is never followed)", ErrUnsafe, x.show(parts[:i+1]))
		}
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: x.show(parts[:i+1]), Err: err}
		}
		cur = fd
	}
	return cur, nil
}

// makeNode makes a device or fifo entry (a tree's, with TreeOptions.Devices).
func (x *extractor) makeNode(dirfd int, name, shown string, hdr *tar.Header) error {
	if err := x.removeNonDir(dirfd, name, shown, true); err != nil {
		return err
	}
	kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	if err := mknodAt(dirfd, name, kind|0o600, dev); err != nil {
		return &fs.PathError{Op: "mknod", Path: shown, Err: err}
	}
	if err := unix.Fchownat(dirfd, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "lchown", Path: shown, Err: err}
	}
	if err := chmodNoFollow(dirfd, name, uint32(hdr.Mode&0o7777)); err != nil {
		return &fs.PathError{Op: "chmod", Path: shown, Err: err}
	}
	return nil
}

// removeNonDir removes whatever non-directory is at name (a symlink is removed, never
// followed), so that a new file or link can take its place. A directory there is
// ErrIsDir, unless emptyDirToo and it is empty: in a tree a later entry replaces an
// earlier one whatever their types, as tar does, where in a copy a directory is the
// caller's.
func (x *extractor) removeNonDir(dirfd int, name, shown string, emptyDirToo bool) error {
	err := unix.Unlinkat(dirfd, name, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.EPERM):
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			// Never one of the directories dirOf keeps open: those are dirfd and its
			// parents, the path to this entry, not the entry itself.
			if emptyDirToo {
				if unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR) == nil {
					return nil
				}
			}
			return fmt.Errorf("%w: %s is a directory and the archive has a file there", ErrIsDir, shown)
		}
	}
	return &fs.PathError{Op: "remove", Path: shown, Err: err}
}

// writeFile creates name afresh (whatever was there, a symlink included, is removed
// first) and writes the entry's content, keeping all-zero blocks as holes; in a tree
// with the owner, mode, extended attributes (TreeOptions.Xattrs) and time it gives.
func (x *extractor) writeFile(dirfd int, name, shown string, r io.Reader, hdr *tar.Header) error {
	perm := uint32(hdr.Mode & 0o777)
	if x.tree != nil {
		perm = 0o600
	}
	var fd int
	for attempt := 0; ; attempt++ {
		var err error
		fd, err = unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || attempt == 3 {
			return &fs.PathError{Op: "create", Path: shown, Err: err}
		}
		if err := x.removeNonDir(dirfd, name, shown, x.tree != nil); err != nil {
			return err
		}
	}
	f := os.NewFile(uintptr(fd), shown)
	err := writeSparse(f, r, hdr.Size, x.buf)
	if err == nil && x.tree != nil {
		err = x.setAttrs(fd, hdr)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", shown, err)
	}
	return nil
}

// setAttrs gives the open file or directory fd the owner, mode and modification time
// hdr says (and for a file, with TreeOptions.Xattrs, its extended attributes).
func (x *extractor) setAttrs(fd int, hdr *tar.Header) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	// After chown, which clears set-id bits (and a file capability, so the attributes
	// come after it too).
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return err
	}
	if x.tree.Xattrs && hdr.Typeflag != tar.TypeDir {
		for k, v := range hdr.PAXRecords {
			if attr, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if err := unix.Fsetxattr(fd, attr, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
					return fmt.Errorf("extended attribute %s: %w", attr, err)
				}
			}
		}
	}
	return setTime(fd, unix.NsecToTimespec(hdr.ModTime.UnixNano()))
}

// finishDirs gives a tree's directories their attributes, deepest first: writing their
// entries changed their times, and a read-only directory must not have stopped its own
// entries being written. Each is found by the same walk, never through a link.
func (x *extractor) finishDirs() error {
	x.uncache()
	sort.SliceStable(x.dirs, func(i, j int) bool { return len(x.dirs[i].parts) > len(x.dirs[j].parts) })
	for _, d := range x.dirs {
		fd, err := x.lookupDir(d.parts)
		if err != nil {
			// Replaced by a later entry (a file where the directory was): nothing to set.
			if errors.Is(err, ErrUnsafe) || errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return err
		}
		err = x.setAttrs(fd, d.hdr)
		if fd != x.base {
			unix.Close(fd)
		}
		if err != nil {
			return fmt.Errorf("directory %s: %w", x.show(d.parts), err)
		}
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
	var off, written int64 // written: the end of the last data written
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
			written = off + int64(j)
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
	if written == size {
		return nil // no hole at the end to size the file by
	}
	return f.Truncate(size)
}
