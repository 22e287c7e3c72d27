package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/tarfs"
)

var jsonUnmarshal = json.Unmarshal

// files serves the file operations. Each runs with the sandbox user's filesystem
// identity (see asUser), so the API can read and write exactly what the sandboxed code
// could, and files it creates belong to that user. Paths must be absolute, may not climb
// with "..", and are never resolved through a symlink: a link planted by the sandboxed
// code cannot redirect a write.
func (s *Server) files(c *conn, req guest.Request) error {
	p, err := checkPath(req.Path)
	if err != nil {
		return err
	}
	switch req.Op {
	case guest.OpWrite:
		return s.asUser(func() error { return s.writeFile(c, p, req) })
	case guest.OpRead:
		var f *os.File
		if err := s.asUser(func() (err error) { f, err = openNoFollow(p, os.O_RDONLY, 0); return err }); err != nil {
			return err
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.IsDir() {
			return invalid("%s is a directory: list it, or copy it out as an archive", p)
		}
		if err := sendData(c, f); err != nil {
			return err
		}
		return c.send(guest.FrameDataEOF, nil)
	case guest.OpStat:
		var info guest.FileInfo
		err := s.asUser(func() error {
			fi, err := os.Lstat(p)
			if err != nil {
				return fileErr(p, err)
			}
			info = fileInfo(p, fi)
			return nil
		})
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, info)
	case guest.OpList:
		out := []guest.FileInfo{}
		err := s.asUser(func() error {
			entries, err := os.ReadDir(p)
			if err != nil {
				return fileErr(p, err)
			}
			for _, e := range entries {
				if fi, err := e.Info(); err == nil {
					out = append(out, fileInfo(path.Join(p, e.Name()), fi))
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, out)
	case guest.OpMkdir:
		mode := fs.FileMode(req.Mode)
		if mode == 0 {
			mode = 0o755
		}
		err := s.asUser(func() error {
			if req.Parents {
				return fileErr(p, os.MkdirAll(p, mode))
			}
			return fileErr(p, os.Mkdir(p, mode))
		})
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpRemove:
		err := s.asUser(func() error {
			if _, err := os.Lstat(p); err != nil {
				return fileErr(p, err)
			}
			if req.Recursive {
				return fileErr(p, os.RemoveAll(p))
			}
			return fileErr(p, os.Remove(p))
		})
		if err != nil {
			return err
		}
		return c.sendJSON(guest.FrameReply, struct{}{})
	case guest.OpRename:
		to, err := checkPath(req.NewPath)
		if err != nil {
			return err
		}
		if err := s.asUser(func() error { return fileErr(p, os.Rename(p, to)) }); err != nil {
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

func (s *Server) writeFile(c *conn, p string, req guest.Request) error {
	mode := fs.FileMode(req.Mode)
	if mode == 0 {
		mode = 0o644
	}
	if req.Parents {
		if err := os.MkdirAll(path.Dir(p), 0o755); err != nil {
			return fileErr(path.Dir(p), err)
		}
	}
	f, err := openNoFollow(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		// Drain what the client sends so it reads our error rather than a broken pipe.
		_, _ = io.Copy(io.Discard, &dataReader{c: c})
		return err
	}
	n, err := io.Copy(f, &dataReader{c: c})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fileErr(p, err)
	}
	return c.sendJSON(guest.FrameReply, map[string]int64{"size": n})
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

// openNoFollow opens p refusing a symlink at any component (openat2 RESOLVE_NO_SYMLINKS
// where the kernel has it, else a component walk then O_NOFOLLOW).
func openNoFollow(p string, flag int, mode fs.FileMode) (*os.File, error) {
	if err := noSymlinks(p); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, flag|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, mode)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, &guest.Error{Code: guest.CodePermission, Message: fmt.Sprintf("%s is a symlink: the files API does not follow symlinks", p)}
		}
		return nil, fileErr(p, err)
	}
	return f, nil
}

// noSymlinks refuses a path with a symlink among its parent directories.
func noSymlinks(p string) error {
	dir := path.Dir(p)
	cur := "/"
	for _, part := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if err != nil {
			return nil // missing parents are reported by the operation itself
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return &guest.Error{Code: guest.CodePermission, Message: fmt.Sprintf("%s goes through the symlink %s: the files API does not follow symlinks", p, cur)}
		}
	}
	return nil
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
	}
	switch {
	case errors.Is(err, tarfs.ErrUnsafe):
		return &guest.Error{Code: guest.CodePermission, Message: err.Error()}
	case errors.Is(err, tarfs.ErrNotDir), errors.Is(err, tarfs.ErrIsDir):
		return &guest.Error{Code: guest.CodeInvalid, Message: err.Error()}
	}
	return &guest.Error{Code: guest.CodeInternal, Message: fmt.Sprintf("%s: %v", p, err)}
}

func fileInfo(p string, fi fs.FileInfo) guest.FileInfo {
	info := guest.FileInfo{
		Name: fi.Name(), Path: p, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()),
		IsDir: fi.IsDir(), ModTime: fi.ModTime().Unix(),
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		info.Symlink, _ = os.Readlink(p)
	}
	return info
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
