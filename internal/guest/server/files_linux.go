package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/tarfs"
)

var jsonUnmarshal = json.Unmarshal

// files serves the file operations. Each runs with the sandbox user's filesystem
// identity (see asUser), so the API can read and write exactly what the sandboxed code
// could, and files it creates belong to that user. Paths must be absolute, may not climb
// with "..", and are never resolved through a symlink (fspath_linux.go): a link planted
// by the sandboxed code cannot redirect a read or a write, nor can one swapped in for a
// directory while the call runs. Nothing in /proc is served.
func (s *Server) files(c *conn, req guest.Request) error {
	p, err := checkPath(req.Path)
	if err != nil {
		return err
	}
	switch req.Op {
	case guest.OpWrite:
		return s.writeFile(c, p, req)
	case guest.OpRead:
		return s.readFile(c, p, req)
	case guest.OpStat:
		var info guest.FileInfo
		err := s.asUser(func() error {
			dir, name, err := openParent(p)
			if err != nil {
				return err
			}
			defer unix.Close(dir)
			if err := checkNotProc(dir, p); err != nil {
				return err
			}
			info, err = statAt(dir, name, p, &idNames{})
			return err
		})
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, info)
	case guest.OpList:
		out := []guest.FileInfo{}
		err := s.asUser(func() error {
			return walk(p, 1, guest.MaxWalkEntries, func(fi guest.FileInfo) error {
				out = append(out, fi)
				return nil
			})
		})
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, out)
	case guest.OpWalk:
		return s.walkTo(c, p, req)
	case guest.OpWatch:
		return s.watch(c, p, req)
	case guest.OpMkdir:
		mode := uint32(req.Mode)
		if mode == 0 {
			mode = 0o755
		}
		var created bool
		err := s.asUser(func() (err error) {
			if req.Parents {
				created, err = mkdirAll(p, mode)
				return err
			}
			return mkdirOne(p, mode)
		})
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, map[string]bool{"created": created || !req.Parents})
	case guest.OpRemove:
		if err := s.asUser(func() error { return removePath(p, req.Recursive) }); err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpRename:
		to, err := checkPath(req.NewPath)
		if err != nil {
			return err
		}
		if err := s.asUser(func() error { return renamePath(p, to) }); err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpUntar:
		err := s.asUser(func() error {
			if err := os.MkdirAll(path.Dir(p), 0o755); err != nil {
				return fileErr(path.Dir(p), err)
			}
			r := &dataReader{c: c}
			// As the sandbox user, a symlink can reach nothing that user could not, so
			// links are kept as they are; the extraction still never writes through one.
			_, err := tarfs.Extract(r, p, tarfs.Options{Links: tarfs.AllLinks})
			// Read to the end of the data (the archive's trailer may still be on its way):
			// replying and closing first would make the client's last writes fail.
			_, _ = io.Copy(io.Discard, r)
			return fileErr(p, err)
		})
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpTar:
		err := s.asUser(func() error {
			w := &dataWriter{c: c}
			if _, err := tarfs.Write(w, p, path.Base(p), tarfs.Options{}); err != nil {
				return fileErr(p, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		return c.send(guest.FrameDataEOF, nil)
	}
	return invalid("unknown file operation %q", req.Op)
}

// regularOnly refuses what is not a regular file: reading a FIFO would wait for a
// writer, a device could stream forever or act on its being opened.
func regularOnly(st *unix.Stat_t, p, verb string) error {
	switch t := fileType(st.Mode); t {
	case guest.TypeFile:
		return nil
	case guest.TypeDir:
		return invalid("%s is a directory: list it, or copy it as an archive (roche cp)", p)
	default:
		return invalid("%s is a %s, not a regular file: the files API %s regular files only", p, t, verb)
	}
}

// readFile sends p's content: the bytes it holds when the read begins, so a file that
// grows meanwhile cannot make the read endless (what is appended is not sent) and one
// truncated meanwhile sends what is left.
func (s *Server) readFile(c *conn, p string, req guest.Request) error {
	var f *os.File
	var size int64
	err := s.asUser(func() error {
		// O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
		fd, err := openInDir(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err != nil {
			return fileErr(p, err)
		}
		f = os.NewFile(uintptr(fd), p)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fileErr(p, err)
		}
		if err := regularOnly(&st, p, "reads"); err != nil {
			return err
		}
		if err := checkNotProc(fd, p); err != nil {
			return err
		}
		size = st.Size
		if req.MaxBytes > 0 && size > req.MaxBytes {
			return &guest.Error{Code: guest.CodeTooLarge, Message: fmt.Sprintf("%s is %d bytes, over the %d bytes this read may move", p, size, req.MaxBytes)}
		}
		return unix.SetNonblock(fd, false)
	})
	if f != nil {
		defer f.Close()
	}
	if err != nil {
		return err
	}
	if err := sendData(c, io.LimitReader(f, size)); err != nil {
		return fileErr(p, err)
	}
	return c.send(guest.FrameDataEOF, nil)
}

// writeFile writes the data frames to p, replacing it (made with its parents when asked).
// A write that fails (no space, the client gone) removes the file: never a truncated one.
func (s *Server) writeFile(c *conn, p string, req guest.Request) error {
	mode := uint32(req.Mode)
	if mode == 0 {
		mode = 0o644
	}
	var f *os.File
	var st unix.Stat_t
	err := s.asUser(func() error {
		if req.Parents && path.Dir(p) != "/" {
			if _, err := mkdirAll(path.Dir(p), 0o755); err != nil {
				return err
			}
		}
		// No O_TRUNC before the type is known: a FIFO or device is refused untouched.
		fd, err := openInDir(p, unix.O_WRONLY|unix.O_CREAT|unix.O_NONBLOCK|unix.O_NOCTTY, mode)
		if err != nil {
			if errors.Is(err, unix.ENXIO) { // a FIFO without a reader
				return invalid("%s is a fifo, not a regular file: the files API writes regular files only", p)
			}
			return fileErr(p, err)
		}
		f = os.NewFile(uintptr(fd), p)
		if err := unix.Fstat(fd, &st); err != nil {
			return fileErr(p, err)
		}
		if err := regularOnly(&st, p, "writes"); err != nil {
			return err
		}
		if err := checkNotProc(fd, p); err != nil {
			return err
		}
		if err := unix.Ftruncate(fd, 0); err != nil {
			return fileErr(p, err)
		}
		if int(st.Uid) == s.uid && st.Mode&0o7777 != mode {
			_ = unix.Fchmod(fd, mode) // the mode asked for, not the umask's leftover
		}
		return unix.SetNonblock(fd, false)
	})
	if err != nil {
		if f != nil {
			f.Close()
		}
		// Drain what the client sends so it reads our error rather than a broken pipe.
		_, _ = io.Copy(io.Discard, &dataReader{c: c})
		return err
	}
	n, err := io.Copy(f, &dataReader{c: c})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = s.asUser(func() error { return removeIfSame(p, &st) })
		return fileErr(p, err)
	}
	return c.sendJSON(guest.FrameReply, map[string]int64{"size": n})
}

// removeIfSame removes p if it is still the file st describes.
func removeIfSame(p string, st *unix.Stat_t) error {
	dir, name, err := openParent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	var now unix.Stat_t
	if err := unix.Fstatat(dir, name, &now, unix.AT_SYMLINK_NOFOLLOW); err != nil || now.Dev != st.Dev || now.Ino != st.Ino {
		return nil
	}
	return unix.Unlinkat(dir, name, 0)
}

// mkdirOne makes the directory p, whose parent must exist.
func mkdirOne(p string, mode uint32) error {
	dir, name, err := openParent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	if name == "" {
		return fileErr(p, unix.EEXIST)
	}
	return fileErr(p, unix.Mkdirat(dir, name, mode))
}

// mkdirAll makes p and its missing parents, and reports whether it made p (false: it
// was a directory already). No component is followed if it is a symlink.
func mkdirAll(p string, mode uint32) (bool, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fileErr("/", err)
	}
	created := false
	cur := "/"
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if part == "" {
			continue
		}
		cur = path.Join(cur, part)
		created = false
		next, err := unix.Openat(fd, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(fd, part, mode); err == nil {
				created = true
			} else if !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return false, fileErr(cur, err)
			}
			next, err = unix.Openat(fd, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			err = symlinkAt(fd, part, cur, err)
			unix.Close(fd)
			if ae := (*guest.Error)(nil); errors.As(err, &ae) && ae.Code == guest.CodeInvalid {
				return false, invalid("%s exists and is not a directory", cur)
			}
			return false, err
		}
		unix.Close(fd)
		fd = next
	}
	unix.Close(fd)
	return created, nil
}

// removePath removes p and, when recursive, everything below it, following no symlink
// (a link is removed, not what it points to).
func removePath(p string, recursive bool) error {
	dir, name, err := openParent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	if name == "" {
		return &guest.Error{Code: guest.CodePermission, Message: "refusing to remove /"}
	}
	if err := checkNotProc(dir, p); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fileErr(p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fileErr(p, unix.Unlinkat(dir, name, 0))
	}
	if !recursive {
		return fileErr(p, unix.Unlinkat(dir, name, unix.AT_REMOVEDIR))
	}
	return fileErr(p, removeTree(dir, name, 0))
}

// maxRemoveDepth bounds the directories removeTree holds open at once.
const maxRemoveDepth = 512

// removeTree removes name in parent and everything below it, by descriptor.
func removeTree(parent int, name string, depth int) error {
	err := unix.Unlinkat(parent, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !isDirErr(err) {
		return err
	}
	if depth > maxRemoveDepth {
		return fmt.Errorf("more than %d directories deep", maxRemoveDepth)
	}
	for pass := 0; ; pass++ {
		fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return unix.Unlinkat(parent, name, 0) // swapped for a link or a file meanwhile
		}
		if err != nil {
			return err
		}
		d := os.NewFile(uintptr(fd), name)
		var first error
		for {
			names, rerr := d.Readdirnames(1024)
			for _, n := range names {
				if err := removeTree(fd, n, depth+1); err != nil && first == nil {
					first = err
				}
			}
			if rerr != nil || len(names) == 0 {
				break
			}
		}
		d.Close()
		if first != nil {
			return first
		}
		err = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
		if !errors.Is(err, unix.ENOTEMPTY) || pass == 2 {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return err
		}
	}
}

// renamePath moves from to to, following no symlink on the way to either (a link is
// moved, not what it points to).
func renamePath(from, to string) error {
	fdir, fname, err := openParent(from)
	if err != nil {
		return err
	}
	defer unix.Close(fdir)
	tdir, tname, err := openParent(to)
	if err != nil {
		return err
	}
	defer unix.Close(tdir)
	if fname == "" || tname == "" {
		return &guest.Error{Code: guest.CodePermission, Message: "refusing to rename /"}
	}
	if err := checkNotProc(fdir, from); err != nil {
		return err
	}
	if err := checkNotProc(tdir, to); err != nil {
		return err
	}
	if err := unix.Renameat(fdir, fname, tdir, tname); err != nil {
		if errors.Is(err, unix.EXDEV) {
			return invalid("%s and %s are on different filesystems (a mount each): copy it and remove the original", from, to)
		}
		if errors.Is(err, unix.ENOENT) {
			if unix.Fstatat(fdir, fname, new(unix.Stat_t), unix.AT_SYMLINK_NOFOLLOW) != nil {
				return fileErr(from, err)
			}
		}
		return fileErr(to, err)
	}
	return nil
}

// walkBatch is how many entries a walk sends per frame.
const walkBatch = 256

// walkTo sends what is below p, to the request's depth, in batches.
func (s *Server) walkTo(c *conn, p string, req guest.Request) error {
	depth := req.Depth
	if depth <= 0 {
		depth = 1
	}
	if depth > guest.MaxWalkDepth {
		return invalid("depth %d is over the most a listing may go, %d", depth, guest.MaxWalkDepth)
	}
	maxEntries := req.MaxEntries
	if maxEntries <= 0 || maxEntries > guest.MaxWalkEntries {
		maxEntries = guest.MaxWalkEntries
	}
	batch := make([]guest.FileInfo, 0, walkBatch)
	err := s.asUser(func() error {
		return walk(p, depth, maxEntries, func(fi guest.FileInfo) error {
			batch = append(batch, fi)
			if len(batch) == walkBatch {
				err := c.sendJSON(guest.FrameReply, batch)
				batch = batch[:0]
				return err
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	if len(batch) > 0 {
		if err := c.sendJSON(guest.FrameReply, batch); err != nil {
			return err
		}
	}
	return c.send(guest.FrameDataEOF, nil)
}

// walk calls fn with every entry below the directory p, to depth levels, each
// directory's entries in name order before what is below them; at most maxEntries, or
// CodeTooLarge. No symlink is followed and nothing in /proc is entered.
func walk(p string, depth, maxEntries int, fn func(guest.FileInfo) error) error {
	fd, err := openNoFollow(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	if err := checkNotProc(fd, p); err != nil {
		unix.Close(fd)
		return err
	}
	w := &walker{fn: fn, left: maxEntries, max: maxEntries, root: p, depth: depth, names: &idNames{}}
	return w.dir(fd, p, 1)
}

type walker struct {
	fn        func(guest.FileInfo) error
	left, max int
	root      string
	depth     int
	names     *idNames
}

// dir lists the open directory fd (path p, at level), then descends; it closes fd.
func (w *walker) dir(fd int, p string, level int) error {
	d := os.NewFile(uintptr(fd), p)
	defer d.Close()
	var names []string
	for {
		batch, err := d.Readdirnames(1024)
		names = append(names, batch...)
		if len(names) > w.left {
			return w.tooMany()
		}
		if err != nil || len(batch) == 0 {
			break
		}
	}
	slices.Sort(names)
	var subdirs []string
	for _, n := range names {
		if w.left == 0 {
			return w.tooMany()
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone meanwhile
		}
		w.left--
		fi := describe(fd, n, path.Join(p, n), &st, w.names)
		if err := w.fn(fi); err != nil {
			return err
		}
		if fi.Type == guest.TypeDir && level < w.depth {
			subdirs = append(subdirs, n)
		}
	}
	for _, n := range subdirs {
		sub, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // gone, swapped, or not the user's to read: listed, not entered
		}
		if onProcFD(sub) {
			unix.Close(sub)
			continue
		}
		if err := w.dir(sub, path.Join(p, n), level+1); err != nil {
			return err
		}
	}
	return nil
}

func (w *walker) tooMany() error {
	return &guest.Error{Code: guest.CodeTooLarge, Message: fmt.Sprintf("%s holds more than %d entries to depth %d: list less deep, or a directory below it", w.root, w.max, w.depth)}
}

// asUser runs fn on an OS thread whose filesystem uid and gid are the sandbox user's and
// that has no supplementary groups. Filesystem identity is per thread in Linux. The
// thread's identity is restored afterwards and the thread returned to the runtime
// (threads are reserved up front; see agent.ThreadReserve); if restoring fails, the
// goroutine exits still locked and the runtime destroys the thread instead.
//
// gVisor's kernel (runsc) accepts setfsuid without applying it; there the thread's
// effective uid and gid are switched instead (setresuid on this thread alone, the
// saved uid staying root so that it can switch back), which also empties its effective
// capabilities while it acts as the user.
func (s *Server) asUser(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		euid, egid := os.Geteuid(), os.Getegid()
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			done <- fmt.Errorf("dropping groups for file access: %w", e)
			return
		}
		syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(s.gid), 0, 0)
		syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(s.uid), 0, 0)
		// setfsuid reports the previous value, not failure: check it took.
		byEUID := false
		if cur, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0); int(cur) != s.uid {
			if !switchEffective(s.uid, s.gid) {
				done <- fmt.Errorf("switching file access to uid %d failed", s.uid)
				return
			}
			byEUID = true
		}
		err := fn()
		if s.restoreIdentity(byEUID, euid, egid) {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// switchEffective sets the calling thread's effective gid and uid, leaving the real and
// saved ones, and reports whether the uid took.
func switchEffective(uid, gid int) bool {
	keep := ^uintptr(0)
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, keep, uintptr(gid), keep); e != 0 {
		return false
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
		return false
	}
	cur, _, _ := syscall.RawSyscall(syscall.SYS_GETEUID, 0, 0, 0)
	return int(cur) == uid
}

// restoreIdentity gives the current thread back the agent's own identity (euid, egid)
// and groups, and reports whether that worked.
func (s *Server) restoreIdentity(byEUID bool, euid, egid int) bool {
	if byEUID {
		keep := ^uintptr(0)
		syscall.RawSyscall(syscall.SYS_SETRESUID, keep, uintptr(euid), keep)
		syscall.RawSyscall(syscall.SYS_SETRESGID, keep, uintptr(egid), keep)
	} else {
		syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(euid), 0, 0)
		syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(egid), 0, 0)
	}
	var groups *uint32
	if len(s.groups) > 0 {
		groups = &s.groups[0]
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, uintptr(len(s.groups)), uintptr(unsafe.Pointer(groups)), 0); e != 0 {
		return false
	}
	if byEUID {
		u, _, _ := syscall.RawSyscall(syscall.SYS_GETEUID, 0, 0, 0)
		g, _, _ := syscall.RawSyscall(syscall.SYS_GETEGID, 0, 0, 0)
		return int(u) == euid && int(g) == egid
	}
	uid, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0)
	gid, _, _ := syscall.RawSyscall(syscall.SYS_SETFSGID, ^uintptr(0), 0, 0)
	return int(uid) == euid && int(gid) == egid
}

// checkPath accepts absolute paths without ".." components.
func checkPath(p string) (string, error) {
	if p == "" || !strings.HasPrefix(p, "/") {
		return "", invalid("path %q is not absolute: give a path starting with /", p)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", invalid("path %q climbs with \"..\": give the path it means without it", p)
		}
	}
	return path.Clean(p), nil
}

// fileErr turns an OS error into an agent error that says what happened and what to do.
func fileErr(p string, err error) error {
	if err == nil {
		return nil
	}
	var ae *guest.Error
	if errors.As(err, &ae) {
		return err
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &guest.Error{Code: guest.CodeNotFound, Message: fmt.Sprintf("%s does not exist in the sandbox", p)}
	case errors.Is(err, syscall.EROFS):
		return &guest.Error{Code: guest.CodePermission, Message: fmt.Sprintf("%s is on the sandbox's read-only root: write under /tmp, or create the sandbox writable", p)}
	case errors.Is(err, fs.ErrPermission):
		return &guest.Error{Code: guest.CodePermission, Message: fmt.Sprintf("permission denied for %s as the sandbox user", p)}
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return &guest.Error{Code: guest.CodeNoSpace, Message: fmt.Sprintf("no space left writing %s: the sandbox's disk or /tmp is full; remove files there first", p)}
	case errors.Is(err, fs.ErrExist):
		return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf("%s already exists", p)}
	case errors.Is(err, syscall.ENOTEMPTY):
		return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf("%s is a non-empty directory: remove it recursively", p)}
	case errors.Is(err, syscall.ENOTDIR):
		return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf("%s: a part of it is not a directory", p)}
	case errors.Is(err, syscall.EISDIR):
		return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf("%s is a directory", p)}
	case errors.Is(err, syscall.ELOOP):
		return &guest.Error{Code: guest.CodePermission, Message: fmt.Sprintf("%s is or goes through a symlink: the files API does not follow symlinks", p)}
	case errors.Is(err, syscall.ENAMETOOLONG):
		return &guest.Error{Code: guest.CodeInvalid, Message: fmt.Sprintf("%s: a name in it is too long", p[:min(len(p), 200)])}
	}
	switch {
	case errors.Is(err, tarfs.ErrUnsafe):
		return &guest.Error{Code: guest.CodePermission, Message: err.Error()}
	case errors.Is(err, tarfs.ErrNotDir), errors.Is(err, tarfs.ErrIsDir):
		return &guest.Error{Code: guest.CodeInvalid, Message: err.Error()}
	}
	return &guest.Error{Code: guest.CodeInternal, Message: fmt.Sprintf("%s: %v", p, err)}
}

// sendData streams r as data frames.
func sendData(c *conn, r io.Reader) error {
	buf := make([]byte, guest.MaxChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if err := c.send(guest.FrameData, buf[:n]); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// dataReader reads data frames until the end-of-data frame.
type dataReader struct {
	c    *conn
	rest []byte
	eof  bool
}

func (d *dataReader) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		if d.eof {
			return 0, io.EOF
		}
		kind, payload, err := d.c.read()
		if err != nil {
			return 0, fmt.Errorf("reading data from the client: %w", err)
		}
		switch kind {
		case guest.FrameData:
			d.rest = payload
		case guest.FrameDataEOF:
			d.eof = true
		default:
			return 0, fmt.Errorf("unexpected frame %q in a data stream", kind)
		}
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

// dataWriter writes data frames.
type dataWriter struct{ c *conn }

func (d *dataWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += guest.MaxChunk {
		end := min(off+guest.MaxChunk, len(p))
		if err := d.c.send(guest.FrameData, p[off:end]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}
