package server

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest"
)

// How the files API finds a path: from "/", one component at a time, never through a
// symlink (openat2 RESOLVE_NO_SYMLINKS where the kernel has it; else each directory
// opened O_NOFOLLOW relative to the one before, which no swap of a component for a link
// can redirect either). The operation itself then acts on the directory it found, by
// name (openat, mkdirat, unlinkat, renameat), so what was checked is what is used.
//
// Nothing on a proc filesystem is served: the agent's own /proc entries (/proc/1, its
// threads' /proc/TID, /proc/self) are readable by the process itself whatever its
// file identity, so reading them as the sandbox user would still show the agent's
// environment, memory and descriptors, which the sandboxed code cannot see.

// openat2Missing is set once openat2 failed as unimplemented (gVisor, old kernels).
var openat2Missing atomic.Bool

// errProc refuses a path on a proc filesystem.
func errProc(p string) error {
	return &guest.Error{Code: guest.CodePermission, Message: fmt.Sprintf("%s is in /proc, which the files API does not serve (it would describe roche-agent, not the sandbox): run a command in the sandbox to read it", p)}
}

// openNoFollow opens p (absolute and clean) with flags, refusing a symlink at any of its
// components, the last included.
func openNoFollow(p string, flags int, mode uint32) (int, error) {
	flags |= unix.O_CLOEXEC | unix.O_NOFOLLOW
	if !openat2Missing.Load() {
		fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
			Flags: uint64(flags), Mode: uint64(mode),
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM) && !canOpenat2():
			openat2Missing.Store(true)
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			return -1, symlinkErr(p, err)
		default:
			return -1, fileErr(p, err)
		}
	}
	dir, name, err := openParent(p)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dir)
	if name == "" {
		fd, err := unix.Openat(dir, ".", flags&^unix.O_NOFOLLOW, mode)
		return fd, fileErr(p, err)
	}
	fd, err := unix.Openat(dir, name, flags, mode)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, symlinkAt(dir, name, p, err)
		}
		return -1, fileErr(p, err)
	}
	return fd, nil
}

// openInDir opens p's last component in its parent directory, found without following
// a symlink and refused when on a proc filesystem. Errors are the system call's, for the
// caller to explain (fileErr), except for the parent's own.
func openInDir(p string, flags int, mode uint32) (int, error) {
	dir, name, err := openParent(p)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dir)
	if err := checkNotProc(dir, p); err != nil {
		return -1, err
	}
	if name == "" {
		name = "."
	}
	fd, err := unix.Openat(dir, name, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, mode)
	if errors.Is(err, unix.ELOOP) {
		return -1, linkErr(p, p)
	}
	return fd, err
}

// canOpenat2 tells EPERM from a seccomp filter (openat2 refused as such) from EPERM on
// the path: "/" itself always opens.
func canOpenat2() bool {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// openParent opens the directory holding p (O_PATH) without following a symlink and
// returns it with p's last component ("" for "/" itself, whose parent is itself).
func openParent(p string) (int, string, error) {
	dir, name := path.Split(p)
	dir = path.Clean(dir)
	if name == "" {
		fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return fd, "", fileErr("/", err)
	}
	fd, err := openDirPath(dir)
	return fd, name, err
}

// openDirPath opens the directory dir as an O_PATH descriptor, no symlink followed.
func openDirPath(dir string) (int, error) {
	if !openat2Missing.Load() {
		return openNoFollow(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fileErr("/", err)
	}
	cur := "/"
	for _, part := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if part == "" {
			continue
		}
		next, err := unix.Openat(fd, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		cur = path.Join(cur, part)
		if err != nil {
			err = symlinkAt(fd, part, cur, err)
			unix.Close(fd)
			return -1, err
		}
		unix.Close(fd)
		fd = next
	}
	return fd, nil
}

// symlinkErr says that p goes through a symlink, naming it when it can be found.
func symlinkErr(p string, err error) error {
	cur := "/"
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if part == "" {
			continue
		}
		cur = path.Join(cur, part)
		fi, lerr := os.Lstat(cur)
		if lerr != nil {
			break
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return linkErr(p, cur)
		}
		if !fi.IsDir() && cur != p {
			return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf("%s: %s is not a directory", p, cur)}
		}
	}
	return fileErr(p, err)
}

// symlinkAt explains a failed openat of name in dir (the component that ends cur).
func symlinkAt(dir int, name, cur string, err error) error {
	var st unix.Stat_t
	if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			return linkErr(cur, cur)
		case unix.S_IFDIR:
		default:
			if errors.Is(err, unix.ENOTDIR) {
				return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf("%s is not a directory", cur)}
			}
		}
	}
	return fileErr(cur, err)
}

func linkErr(p, link string) error {
	if p == link {
		return &guest.Error{Code: guest.CodePermission, Message: fmt.Sprintf("%s is a symlink: the files API does not follow symlinks", p)}
	}
	return &guest.Error{Code: guest.CodePermission, Message: fmt.Sprintf("%s goes through the symlink %s: the files API does not follow symlinks", p, link)}
}

// onProcFD reports whether fd is on a proc filesystem.
func onProcFD(fd int) bool {
	var st unix.Statfs_t
	return unix.Fstatfs(fd, &st) == nil && st.Type == unix.PROC_SUPER_MAGIC
}

// checkNotProc refuses a descriptor on a proc filesystem.
func checkNotProc(fd int, p string) error {
	if onProcFD(fd) {
		return errProc(p)
	}
	return nil
}

// fileType names the type of a stat mode.
func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return guest.TypeFile
	case unix.S_IFDIR:
		return guest.TypeDir
	case unix.S_IFLNK:
		return guest.TypeSymlink
	case unix.S_IFIFO:
		return guest.TypeFIFO
	case unix.S_IFSOCK:
		return guest.TypeSocket
	}
	return guest.TypeDevice
}

// goMode is a stat mode as an fs.FileMode: the permission bits, the special bits and the
// type, as Go's os package builds it.
func goMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// describe is the FileInfo of name in dir (p its path), from a stat that did not follow
// it.
func describe(dir int, name, p string, st *unix.Stat_t, names *idNames) guest.FileInfo {
	mode := goMode(st.Mode)
	info := guest.FileInfo{
		Name: path.Base(p), Path: p, Size: st.Size, Mode: uint32(mode.Perm()),
		IsDir: mode.IsDir(), Type: fileType(st.Mode),
		ModTime: st.Mtim.Sec, ModTimeNS: st.Mtim.Nano(),
		UID: int(st.Uid), GID: int(st.Gid),
	}
	if names != nil {
		info.Owner, info.Group = names.user(int(st.Uid)), names.group(int(st.Gid))
	}
	if info.Type == guest.TypeSymlink {
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(dir, name, buf); err == nil {
			info.Symlink = string(buf[:n])
		}
	}
	return info
}

// statAt describes name in dir without following it.
func statAt(dir int, name, p string, names *idNames) (guest.FileInfo, error) {
	var st unix.Stat_t
	n := name
	flags := unix.AT_SYMLINK_NOFOLLOW
	if n == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Fstatat(dir, n, &st, flags); err != nil {
		return guest.FileInfo{}, fileErr(p, err)
	}
	return describe(dir, name, p, &st, names), nil
}

// idNames names uids and gids from the sandbox's /etc/passwd and /etc/group, read (as
// the sandbox user, no symlink followed) when first asked.
type idNames struct {
	users, groups map[int]string
	read          bool
}

func (n *idNames) load() {
	if n.read {
		return
	}
	n.read = true
	n.users, n.groups = readIDs("/etc/passwd"), readIDs("/etc/group")
}

func (n *idNames) user(uid int) string {
	n.load()
	return n.users[uid]
}

func (n *idNames) group(gid int) string {
	n.load()
	return n.groups[gid]
}

// readIDs maps the third field of a passwd or group file to the first, reading at most
// 1 MiB of it.
func readIDs(file string) map[int]string {
	fd, err := openNoFollow(file, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), file)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	out := map[int]string{}
	sc := bufio.NewScanner(&limitedReader{r: f, n: 1 << 20})
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 4)
		if len(fields) < 3 {
			continue
		}
		if id, err := strconv.Atoi(fields[2]); err == nil {
			if _, seen := out[id]; !seen {
				out[id] = fields[0]
			}
		}
	}
	return out
}

type limitedReader struct {
	r interface{ Read([]byte) (int, error) }
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("file too long")
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// isDirErr reports an unlinkat refused because name is a directory.
func isDirErr(err error) bool {
	return errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EPERM)
}
