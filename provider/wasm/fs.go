package wasm

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

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
// It can also hold the directory to a quota of bytes and entries (see quota), counts
// the files it opens against the sandbox's cap on open files (see openFiles), and
// reports EROFS for writes to a read-only directory where wazero's ReadFS says ENOSYS.
type confinedFS struct {
	experimentalsys.FS
	dir      string // absolute host path, no symlinks
	readOnly bool
	quota    *quota       // nil: unlimited
	files    *openFiles   // nil: uncounted
	sig      *spaceSignal // raised when files refuses an open
}

func newConfinedFS(dir string, readOnly bool, q *quota, files *openFiles, sig *spaceSignal) *confinedFS {
	var inner experimentalsys.FS = sysfs.DirFS(dir)
	if readOnly {
		inner = &sysfs.ReadFS{FS: inner}
	}
	return &confinedFS{FS: inner, dir: dir, readOnly: readOnly, quota: q, files: files, sig: sig}
}

// host is the host path of p, a path relative to the directory that check accepted.
func (c *confinedFS) host(p string) string { return filepath.Join(c.dir, strings.Trim(p, "/")) }

// exists reports whether p names an entry now (a symbolic link included).
func (c *confinedFS) exists(p string) bool {
	_, err := os.Lstat(c.host(p))
	return err == nil
}

// newEntry reserves an entry in the quota for an entry about to be made, or returns
// the refusal's errno when the quota has no room left.
func (c *confinedFS) newEntry() experimentalsys.Errno {
	if c.quota == nil || c.quota.addEntry() {
		return 0
	}
	return c.quota.refuse()
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
	// wazero opens a preopened directory itself, lazily, as "." with no permission bits
	// (a guest's path_open always passes 0o600), and panics if that fails: counted, but
	// never refused (one per directory per instance).
	if p == "." && perm == 0 && flag == experimentalsys.O_RDONLY {
		c.files.force()
	} else if !c.files.take() {
		return nil, c.sig.tooMany()
	}
	// A file the open makes is a new entry (a race with another instance of the
	// sandbox costs at most one, which the next count at an instance's start settles).
	created := false
	if c.quota != nil && flag&experimentalsys.O_CREAT != 0 && !c.exists(p) {
		if errno := c.newEntry(); errno != 0 {
			c.files.put()
			return nil, errno
		}
		created = true
	}
	f, errno := c.FS.OpenFile(p, flag, perm)
	if errno != 0 {
		c.files.put()
		if created {
			c.quota.dropEntry()
		}
		return nil, errno
	}
	if c.quota != nil && flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR) != 0 {
		f = &quotaFile{File: f, quota: c.quota}
	}
	return c.files.wrap(f), 0
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

// Mkdir implements experimentalsys.FS. A directory is an entry of the quota.
func (c *confinedFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	if errno := c.check(p, false); errno != 0 {
		return errno
	}
	if c.exists(p) {
		return experimentalsys.EEXIST
	}
	if errno := c.newEntry(); errno != 0 {
		return errno
	}
	errno := c.FS.Mkdir(p, perm)
	if errno != 0 && c.quota != nil {
		c.quota.dropEntry()
	}
	return errno
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
	freed, replaced := c.regularSize(to), c.quota != nil && c.exists(to)
	errno := c.FS.Rename(from, to)
	if errno == 0 && c.quota != nil {
		c.quota.add(-freed)
		if replaced {
			c.quota.dropEntry()
		}
	}
	return errno
}

// Rmdir implements experimentalsys.FS.
func (c *confinedFS) Rmdir(p string) experimentalsys.Errno {
	if errno := c.check(p, false); errno != 0 {
		return errno
	}
	errno := c.FS.Rmdir(p)
	if errno == 0 && c.quota != nil {
		c.quota.dropEntry()
	}
	return errno
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
		c.quota.dropEntry()
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
	if c.exists(newPath) {
		return experimentalsys.EEXIST
	}
	// A hard link is a new entry, as tmpfs counts it against nr_inodes.
	if errno := c.newEntry(); errno != 0 {
		return errno
	}
	errno := c.FS.Link(oldPath, newPath)
	if errno != 0 && c.quota != nil {
		c.quota.dropEntry()
	}
	return errno
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
//
// It caps the directory's entries too (files, directories, hard links: what a tmpfs
// counts against its nr_inodes), one per bytesPerEntry of the byte limit, as an empty
// file costs no bytes but a host inode: without it a guest could take the inodes of
// the host's filesystem with empty files. A create past it fails with ENOSPC, as on a
// tmpfs out of inodes.
type quota struct {
	mu    sync.Mutex
	used  int64
	limit int64
	// entries below the directory, and how many it may hold.
	entries, maxEntries int64
	// signal, when set, is raised on every refusal (see noSpaceAsENOSPC).
	signal *spaceSignal
}

// bytesPerEntry is how many bytes of a directory's byte limit buy one entry: /tmp's
// 64 MiB hold 65,536, what a 64 MiB tmpfs gets by default (nr_inodes, half the RAM
// pages) on a machine of 512 MiB, the default memory of a microVM sandbox, whose /tmp
// is such a tmpfs.
const bytesPerEntry = 1024

// entriesFor is the entry limit of a directory holding limit bytes.
func entriesFor(limit int64) int64 { return max(limit/bytesPerEntry, 1024) }

// addEntry reserves one entry, reporting whether it fit.
func (q *quota) addEntry() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.entries >= q.maxEntries {
		return false
	}
	q.entries++
	return true
}

// dropEntry gives one entry back.
func (q *quota) dropEntry() {
	q.mu.Lock()
	q.entries = max(q.entries-1, 0)
	q.mu.Unlock()
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

// dirUsage sums the sizes of the regular files under dir and counts its entries, the
// starting point of its quota, leaving out the subdirectories in skip (which have
// quotas of their own).
func dirUsage(dir string, skip ...string) (bytes, entries int64) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable parts cannot be counted; the guest cannot read them either
		}
		if p == dir {
			return nil
		}
		if d.IsDir() {
			for _, s := range skip {
				if p == s {
					return filepath.SkipDir
				}
			}
		}
		entries++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				bytes += fi.Size()
			}
		}
		return nil
	})
	return bytes, entries
}

// openFiles is a sandbox's cap on the files its guests hold open. Every file a guest
// opens is a descriptor of the provider's own process (roched's), so without a cap one
// sandbox could open files until the process's RLIMIT_NOFILE ran out, leaving its
// neighbours and roched none. The cap is the open-file limit every other provider gives
// a process in a sandbox (roche.DefaultOpenFiles), shared by all the sandbox's
// instances in this process; an open past it fails with EMFILE (see noSpaceAsENOSPC).
type openFiles struct {
	mu    sync.Mutex
	n     int
	limit int
}

// take counts one more open file, reporting whether it fits under the cap.
func (o *openFiles) take() bool {
	if o == nil {
		return true
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n >= o.limit {
		return false
	}
	o.n++
	return true
}

// force counts one more open file, over the cap if need be.
func (o *openFiles) force() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.n++
	o.mu.Unlock()
}

// put gives one back.
func (o *openFiles) put() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.n = max(o.n-1, 0)
	o.mu.Unlock()
}

// held is how many files are open now.
func (o *openFiles) held() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// wrap makes f give its place back when it is closed.
func (o *openFiles) wrap(f experimentalsys.File) experimentalsys.File {
	if o == nil {
		return f
	}
	return &countedFile{File: f, files: o}
}

// countedFile is a file counted against its sandbox's openFiles until it is closed.
type countedFile struct {
	experimentalsys.File
	files  *openFiles
	closed atomic.Bool
}

// Close implements experimentalsys.File.
func (f *countedFile) Close() experimentalsys.Errno {
	errno := f.File.Close()
	if !f.closed.Swap(true) {
		f.files.put()
	}
	return errno
}

// IsNonblock implements experimentalsys.PollableFile by forwarding.
func (f *countedFile) IsNonblock() bool {
	if pf, ok := f.File.(experimentalsys.PollableFile); ok {
		return pf.IsNonblock()
	}
	return false
}

// SetNonblock implements experimentalsys.PollableFile by forwarding.
func (f *countedFile) SetNonblock(enable bool) experimentalsys.Errno {
	if pf, ok := f.File.(experimentalsys.PollableFile); ok {
		return pf.SetNonblock(enable)
	}
	return experimentalsys.ENOSYS
}

// Poll implements experimentalsys.Pollable by forwarding.
func (f *countedFile) Poll(flag experimentalsys.Pflag, timeoutMillis int32) (bool, experimentalsys.Errno) {
	if p, ok := f.File.(experimentalsys.Pollable); ok {
		return p.Poll(flag, timeoutMillis)
	}
	return true, 0
}
