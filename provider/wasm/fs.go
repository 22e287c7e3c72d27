package wasm

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"
)

// confinedFS is a host directory as the guest sees it. wazero's DirFS already refuses
// paths that climb out with "..", but it follows symbolic links on the host, so a guest
// that could create one (os.symlink('../../../etc/passwd', '/tmp/x')) could read and
// write anything the host user can. confinedFS closes that: the guest cannot create
// symbolic links, and a path whose existing components include one is refused, which
// also covers links that were already there in a host directory mounted in.
//
// It can also hold the directory to a byte quota (see quota), and reports EROFS for
// writes to a read-only directory where wazero's ReadFS says ENOSYS.
type confinedFS struct {
	experimentalsys.FS
	dir      string // absolute host path, no symlinks
	readOnly bool
	quota    *quota // nil: unlimited
}

func newConfinedFS(dir string, readOnly bool, q *quota) *confinedFS {
	var inner experimentalsys.FS = sysfs.DirFS(dir)
	if readOnly {
		inner = &sysfs.ReadFS{FS: inner}
	}
	return &confinedFS{FS: inner, dir: dir, readOnly: readOnly, quota: q}
}

// String implements fmt.Stringer for wazero's messages.
func (c *confinedFS) String() string { return c.dir }

// errSymlink is what following a symbolic link gets: permission to do it is withheld.
const errSymlink = experimentalsys.EPERM

// check walks the existing components of p (relative to the directory) and refuses any
// that is a symbolic link. followLast says whether the operation would follow a link in
// the last component (open, stat) or act on the link itself (lstat, unlink, rename).
func (c *confinedFS) check(p string, followLast bool) experimentalsys.Errno {
	p = strings.Trim(p, "/")
	if p == "" || p == "." {
		return 0
	}
	parts := strings.Split(p, "/")
	cur := c.dir
	for i, part := range parts {
		switch part {
		case "", ".":
			continue
		case "..":
			return experimentalsys.EPERM // wazero never passes these; refuse if it ever does
		}
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if err != nil {
			// The rest does not exist (or is not a directory): the operation itself
			// reports that, and creates only plain entries.
			return 0
		}
		if fi.Mode()&fs.ModeSymlink != 0 && (followLast || i < len(parts)-1) {
			return errSymlink
		}
	}
	return 0
}

const writeFlags = experimentalsys.O_WRONLY | experimentalsys.O_RDWR | experimentalsys.O_APPEND |
	experimentalsys.O_CREAT | experimentalsys.O_TRUNC | experimentalsys.O_EXCL

// OpenFile implements experimentalsys.FS.
func (c *confinedFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if c.readOnly && flag&writeFlags != 0 {
		return nil, experimentalsys.EROFS
	}
	if errno := c.check(p, true); errno != 0 {
		return nil, errno
	}
	f, errno := c.FS.OpenFile(p, flag, perm)
	if errno != 0 || c.quota == nil || flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR) == 0 {
		return f, errno
	}
	return &quotaFile{File: f, quota: c.quota}, 0
}

// Stat implements experimentalsys.FS.
func (c *confinedFS) Stat(p string) (sys.Stat_t, experimentalsys.Errno) {
	if errno := c.check(p, true); errno != 0 {
		return sys.Stat_t{}, errno
	}
	return c.FS.Stat(p)
}

// Lstat implements experimentalsys.FS.
func (c *confinedFS) Lstat(p string) (sys.Stat_t, experimentalsys.Errno) {
	if errno := c.check(p, false); errno != 0 {
		return sys.Stat_t{}, errno
	}
	return c.FS.Lstat(p)
}

// Mkdir implements experimentalsys.FS.
func (c *confinedFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	if errno := c.check(p, false); errno != 0 {
		return errno
	}
	return c.FS.Mkdir(p, perm)
}

// Chmod implements experimentalsys.FS.
func (c *confinedFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	if errno := c.check(p, true); errno != 0 {
		return errno
	}
	return c.FS.Chmod(p, perm)
}

// Rename implements experimentalsys.FS. A file replaced by the rename frees its bytes.
func (c *confinedFS) Rename(from, to string) experimentalsys.Errno {
	if errno := c.check(from, false); errno != 0 {
		return errno
	}
	if errno := c.check(to, false); errno != 0 {
		return errno
	}
	freed := c.regularSize(to)
	errno := c.FS.Rename(from, to)
	if errno == 0 && c.quota != nil {
		c.quota.add(-freed)
	}
	return errno
}

// Rmdir implements experimentalsys.FS.
func (c *confinedFS) Rmdir(p string) experimentalsys.Errno {
	if errno := c.check(p, false); errno != 0 {
		return errno
	}
	return c.FS.Rmdir(p)
}

// Unlink implements experimentalsys.FS. Removing a file frees its bytes.
func (c *confinedFS) Unlink(p string) experimentalsys.Errno {
	if errno := c.check(p, false); errno != 0 {
		return errno
	}
	freed := c.regularSize(p)
	errno := c.FS.Unlink(p)
	if errno == 0 && c.quota != nil {
		c.quota.add(-freed)
	}
	return errno
}

// Link implements experimentalsys.FS. A hard link to a symbolic link would be a new
// symbolic link, so the old name must not be one.
func (c *confinedFS) Link(oldPath, newPath string) experimentalsys.Errno {
	if errno := c.check(oldPath, true); errno != 0 {
		return errno
	}
	if errno := c.check(newPath, false); errno != 0 {
		return errno
	}
	return c.FS.Link(oldPath, newPath)
}

// Symlink implements experimentalsys.FS: guests cannot create symbolic links, because a
// link moved by a later rename could come to point outside the directory.
func (c *confinedFS) Symlink(_, _ string) experimentalsys.Errno {
	if c.readOnly {
		return experimentalsys.EROFS
	}
	return experimentalsys.EPERM
}

// Readlink implements experimentalsys.FS.
func (c *confinedFS) Readlink(p string) (string, experimentalsys.Errno) {
	if errno := c.check(p, false); errno != 0 {
		return "", errno
	}
	return c.FS.Readlink(p)
}

// Utimens implements experimentalsys.FS.
func (c *confinedFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	if errno := c.check(p, true); errno != 0 {
		return errno
	}
	return c.FS.Utimens(p, atim, mtim)
}

// regularSize is the size of p if it is a regular file with no other hard link, the
// bytes its removal gives back; 0 otherwise.
func (c *confinedFS) regularSize(p string) int64 {
	if c.quota == nil {
		return 0
	}
	st, errno := c.FS.Lstat(p)
	if errno != 0 || !st.Mode.IsRegular() || st.Nlink > 1 {
		return 0
	}
	return st.Size
}

// quota caps the bytes held by one of the sandbox's own writable directories, as the
// Docker provider's sized filesystems and 64 MiB tmpfs do: without it a guest could fill
// the disk (or the memory-backed runtime directory) the state directory lives on. It starts from the
// directory's size when the exec begins and follows the guest's writes, truncations and
// removals; files copied in with CopyTo count against it but are never refused.
type quota struct {
	mu    sync.Mutex
	used  int64
	limit int64
	// signal, when set, is raised on every refusal (see noSpaceAsENOSPC).
	signal *spaceSignal
}

// refuse reports a refused write: errNoSpace, with the instance's signal raised.
func (q *quota) refuse() experimentalsys.Errno {
	if q.signal != nil {
		q.signal.refused.Store(true)
	}
	return errNoSpace
}

func (q *quota) add(n int64) {
	q.mu.Lock()
	q.used = max(q.used+n, 0)
	q.mu.Unlock()
}

// grow reserves n more bytes and reports how many of them fit.
func (q *quota) grow(n int64) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	room := max(q.limit-q.used, 0)
	n = min(n, room)
	q.used += n
	return n
}

// errNoSpace is what a write past the quota gets from the file. WASI has ENOSPC but
// wazero's errno set does not; the guest sees ENOSPC all the same (noSpaceAsENOSPC).
const errNoSpace = experimentalsys.EIO

// quotaFile charges the bytes that writes add to a file against its directory's quota.
type quotaFile struct {
	experimentalsys.File
	quota *quota
}

// growth is how many bytes writing n bytes at off (or at the end, when off < 0) adds.
func (f *quotaFile) growth(off int64, n int) (size int64, grow int64, errno experimentalsys.Errno) {
	st, errno := f.File.Stat()
	if errno != 0 {
		return 0, 0, errno
	}
	if off < 0 {
		if f.File.IsAppend() {
			off = st.Size
		} else if off, errno = f.File.Seek(0, io.SeekCurrent); errno != 0 {
			return 0, 0, errno
		}
	}
	return st.Size, max(off+int64(n)-st.Size, 0), 0
}

// limited trims buf so that writing it adds no more than the quota allows; a write that
// cannot add a single byte fails.
func (f *quotaFile) limited(buf []byte, off int64) ([]byte, experimentalsys.Errno) {
	_, grow, errno := f.growth(off, len(buf))
	if errno != 0 || grow == 0 {
		return buf, errno
	}
	got := f.quota.grow(grow)
	if got == grow {
		return buf, 0
	}
	keep := len(buf) - int(grow-got)
	if keep <= 0 {
		f.quota.add(-got)
		return nil, f.quota.refuse()
	}
	return buf[:keep], 0
}

// Write implements experimentalsys.File.
func (f *quotaFile) Write(buf []byte) (int, experimentalsys.Errno) {
	b, errno := f.limited(buf, -1)
	if errno != 0 {
		return 0, errno
	}
	return f.File.Write(b)
}

// Pwrite implements experimentalsys.File.
func (f *quotaFile) Pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	if off < 0 {
		return 0, experimentalsys.EINVAL
	}
	b, errno := f.limited(buf, off)
	if errno != 0 {
		return 0, errno
	}
	return f.File.Pwrite(b, off)
}

// Truncate implements experimentalsys.File.
func (f *quotaFile) Truncate(size int64) experimentalsys.Errno {
	st, errno := f.File.Stat()
	if errno != 0 {
		return errno
	}
	if d := size - st.Size; d > 0 {
		if got := f.quota.grow(d); got != d {
			f.quota.add(-got)
			return f.quota.refuse()
		}
	} else {
		f.quota.add(d)
	}
	return f.File.Truncate(size)
}

// IsNonblock implements experimentalsys.PollableFile by forwarding, so that wrapping a
// file does not change what fd_fdstat_set_flags can do with it.
func (f *quotaFile) IsNonblock() bool {
	if pf, ok := f.File.(experimentalsys.PollableFile); ok {
		return pf.IsNonblock()
	}
	return false
}

// SetNonblock implements experimentalsys.PollableFile by forwarding.
func (f *quotaFile) SetNonblock(enable bool) experimentalsys.Errno {
	if pf, ok := f.File.(experimentalsys.PollableFile); ok {
		return pf.SetNonblock(enable)
	}
	return experimentalsys.ENOSYS
}

// Poll implements experimentalsys.Pollable by forwarding.
func (f *quotaFile) Poll(flag experimentalsys.Pflag, timeoutMillis int32) (bool, experimentalsys.Errno) {
	if p, ok := f.File.(experimentalsys.Pollable); ok {
		return p.Poll(flag, timeoutMillis)
	}
	return true, 0
}

// dirSize sums the sizes of the regular files under dir, the starting point of its
// quota, leaving out the subdirectories in skip (which have quotas of their own).
func dirSize(dir string, skip ...string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable parts cannot be counted; the guest cannot read them either
		}
		if d.IsDir() && p != dir {
			for _, s := range skip {
				if p == s {
					return filepath.SkipDir
				}
			}
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
