package wasm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/roche-sandbox/roche"
)

var _ roche.FileSystem = (*Provider)(nil)

// The files API (roche.FileSystem) reaches the sandbox's files through the same mapping
// as CopyTo and CopyFrom: /, /tmp, /workspace and the host mounts, each a host
// directory. Paths are absolute sandbox paths without "..", and are never resolved
// through a symbolic link (guests cannot make one; a host mount may hold some), so
// nothing outside the sandbox's directories can be reached. Writes need a writable
// directory, as the sandboxed code's would. Python's standard library under /usr lives
// inside python.wasm and is not reachable this way.

// fileTarget is a sandbox path resolved for the files API.
type fileTarget struct {
	id    string
	guest string     // clean absolute sandbox path
	m     mountPoint // the directory holding it
	rel   string     // its path relative to m.host; "" for the directory itself
}

// relOrDot is rel as os.Root wants it.
func (t fileTarget) relOrDot() string {
	if t.rel == "" {
		return "."
	}
	return t.rel
}

// fileTarget resolves the sandbox path p of sandbox id, refusing ".." and any symbolic
// link among its parents.
func (p *Provider) fileTarget(ctx context.Context, id, guest string) (fileTarget, error) {
	if err := ctx.Err(); err != nil {
		return fileTarget{}, err
	}
	rec, err := p.lookup(id)
	if err != nil {
		return fileTarget{}, err
	}
	if guest == "" || !path.IsAbs(guest) {
		return fileTarget{}, fmt.Errorf("%w: path %q is not absolute: give a path starting with /", roche.ErrInvalidConfig, guest)
	}
	for _, part := range strings.Split(guest, "/") {
		if part == ".." {
			return fileTarget{}, fmt.Errorf("%w: path %q climbs with \"..\": give the path it means without it", roche.ErrInvalidConfig, guest)
		}
	}
	g := path.Clean(guest)
	if within(g, guestStdlib) || within(g, guestBoot) {
		return fileTarget{}, fmt.Errorf("%w: %s is in python.wasm's standard library, which lives inside the module: the files API reaches /tmp, /workspace, / and the mounts",
			roche.ErrUnsupported, g)
	}
	mounts, err := p.sandboxMounts(id, rec.Config)
	if err != nil {
		return fileTarget{}, fmt.Errorf("wasm sandbox %s: %w", id, err)
	}
	m, rel := resolve(mounts, g)
	t := fileTarget{id: id, guest: g, m: m, rel: rel}
	if err := t.noSymlinkedParents(); err != nil {
		return fileTarget{}, err
	}
	return t, nil
}

// noSymlinkedParents refuses a path that goes through a symbolic link. Missing
// components end the walk: the operation reports them.
func (t fileTarget) noSymlinkedParents() error {
	if t.rel == "" {
		return nil
	}
	parts := strings.Split(t.rel, "/")
	cur := t.m.host
	for i, part := range parts[:len(parts)-1] {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if err != nil {
			return nil
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			through := path.Join(t.m.guest, strings.Join(parts[:i+1], "/"))
			return fmt.Errorf("%w: %s goes through the symlink %s: the files API does not follow symlinks", roche.ErrPermission, t.guest, through)
		}
	}
	return nil
}

// writable refuses writes where the sandboxed code could not write either.
func (t fileTarget) writable() error {
	if !t.m.readOnly {
		return nil
	}
	if t.m.own {
		return fmt.Errorf("%w: %s is on wasm sandbox %s's read-only root: write under /tmp or /workspace, or create the sandbox writable",
			roche.ErrPermission, t.guest, t.id)
	}
	return fmt.Errorf("%w: %s is in a read-only mount (of %s) in wasm sandbox %s", roche.ErrPermission, t.guest, t.m.host, t.id)
}

// structural refuses removing or replacing one of the directories the sandbox is made of.
func (t fileTarget) structural(op string) error {
	if t.rel == "" {
		return fmt.Errorf("%w: cannot %s %s: it is a directory the sandbox is made of; work on what is below it",
			roche.ErrPermission, op, t.guest)
	}
	return nil
}

func (t fileTarget) root() (*os.Root, error) {
	r, err := os.OpenRoot(t.m.host)
	if err != nil {
		return nil, fmt.Errorf("%w: wasm sandbox %s: opening %s: %v", roche.ErrUnavailable, t.id, t.m.host, err)
	}
	return r, nil
}

// lstat describes the target itself, refusing a symbolic link unless allowed.
func (t fileTarget) lstat(r *os.Root, allowSymlink bool) (fs.FileInfo, error) {
	fi, err := r.Lstat(t.relOrDot())
	if err != nil {
		return nil, t.err(err)
	}
	if !allowSymlink && fi.Mode()&fs.ModeSymlink != 0 {
		return nil, fmt.Errorf("%w: %s is a symlink: the files API does not follow symlinks", roche.ErrPermission, t.guest)
	}
	return fi, nil
}

// err turns an OS error into one that says what happened to which sandbox path.
func (t fileTarget) err(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s in wasm sandbox %s: %w", t.guest, t.id, err)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s does not exist in wasm sandbox %s", roche.ErrNotFound, t.guest, t.id)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%w: %s already exists in wasm sandbox %s", roche.ErrInvalidConfig, t.guest, t.id)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: %s: a parent is not a directory in wasm sandbox %s", roche.ErrInvalidConfig, t.guest, t.id)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %s in wasm sandbox %s: %v", roche.ErrPermission, t.guest, t.id, err)
	}
	return fmt.Errorf("%s in wasm sandbox %s: %w", t.guest, t.id, err)
}

// WriteFile implements roche.FileSystem. The content is written to a temporary file
// beside path and renamed over it, so a failed or cancelled upload leaves the old file
// (or none), never a truncated one. Missing parents are made.
func (p *Provider) WriteFile(ctx context.Context, id, guest string, r io.Reader, mode fs.FileMode) error {
	t, err := p.fileTarget(ctx, id, guest)
	if err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if t.rel == "" {
		return fmt.Errorf("%w: %s is a directory: write to a file below it", roche.ErrInvalidConfig, t.guest)
	}
	root, err := t.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if dir := path.Dir(t.rel); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return t.err(err)
		}
		// Made or not, the parents must hold no symlink now either.
		if err := t.noSymlinkedParents(); err != nil {
			return err
		}
	}
	if fi, err := root.Lstat(t.rel); err == nil {
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: %s is a symlink: the files API does not follow symlinks", roche.ErrPermission, t.guest)
		}
		if fi.IsDir() {
			return fmt.Errorf("%w: %s is a directory: remove it first or write elsewhere", roche.ErrInvalidConfig, t.guest)
		}
	}
	if mode = mode.Perm(); mode == 0 {
		mode = 0o644
	}
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return err
	}
	tmp := path.Join(path.Dir(t.rel), ".roche-upload-"+hex.EncodeToString(suffix[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return t.err(err)
	}
	_, err = io.Copy(f, ctxReader{ctx, r})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// The mode is set again: the process umask may have narrowed it at creation.
		err = root.Chmod(tmp, mode)
	}
	if err == nil {
		err = root.Rename(tmp, t.rel)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return t.err(err)
	}
	return nil
}

// ReadFile implements roche.FileSystem.
func (p *Provider) ReadFile(ctx context.Context, id, guest string, w io.Writer) error {
	t, err := p.fileTarget(ctx, id, guest)
	if err != nil {
		return err
	}
	root, err := t.root()
	if err != nil {
		return err
	}
	defer root.Close()
	fi, err := t.lstat(root, false)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%w: %s is a directory: list it, or copy it out as an archive", roche.ErrInvalidConfig, t.guest)
	}
	if !fi.Mode().IsRegular() {
		// A host mount may hold a FIFO (a read would wait for a writer) or a device.
		return fmt.Errorf("%w: %s is a %s, not a regular file: the files API reads regular files only",
			roche.ErrInvalidConfig, t.guest, fileInfo(root, t.relOrDot(), t.guest, fi).FileType())
	}
	f, err := root.OpenFile(t.rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return t.err(err)
	}
	defer f.Close()
	now, err := f.Stat()
	if err != nil {
		return t.err(err)
	}
	if !now.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file: the files API reads regular files only", roche.ErrInvalidConfig, t.guest)
	}
	// What the file holds when the read begins: one that grows meanwhile cannot make the
	// read endless.
	if _, err := io.Copy(w, ctxReader{ctx, io.LimitReader(f, now.Size())}); err != nil {
		return t.err(err)
	}
	return nil
}

// ListDir implements roche.FileSystem: the entries of a directory, by name, each
// described without following a symlink.
func (p *Provider) ListDir(ctx context.Context, id, guest string) ([]roche.FileInfo, error) {
	t, err := p.fileTarget(ctx, id, guest)
	if err != nil {
		return nil, err
	}
	root, err := t.root()
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fi, err := t.lstat(root, false)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory", roche.ErrInvalidConfig, t.guest)
	}
	entries, err := fs.ReadDir(root.FS(), t.relOrDot()) // sorted by name
	if err != nil {
		return nil, t.err(err)
	}
	out := make([]roche.FileInfo, 0, len(entries))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".roche-upload-") {
			continue // a WriteFile in progress
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		rel := path.Join(t.relOrDot(), e.Name())
		out = append(out, fileInfo(root, rel, path.Join(t.guest, e.Name()), info))
	}
	return out, nil
}

// Stat implements roche.FileSystem.
func (p *Provider) Stat(ctx context.Context, id, guest string) (roche.FileInfo, error) {
	t, err := p.fileTarget(ctx, id, guest)
	if err != nil {
		return roche.FileInfo{}, err
	}
	root, err := t.root()
	if err != nil {
		return roche.FileInfo{}, err
	}
	defer root.Close()
	fi, err := t.lstat(root, true)
	if err != nil {
		return roche.FileInfo{}, err
	}
	info := fileInfo(root, t.relOrDot(), t.guest, fi)
	info.Name = path.Base(t.guest)
	return info, nil
}

// fileInfo describes one entry as the Docker provider does: permission bits, plus its
// type (ModeDir, ModeSymlink, ...). Owners are left out: a wasm sandbox has no users.
func fileInfo(root *os.Root, rel, guest string, fi fs.FileInfo) roche.FileInfo {
	info := roche.FileInfo{
		Name: fi.Name(), Path: guest, Size: fi.Size(),
		Mode:  fi.Mode().Perm() | fi.Mode()&(fs.ModeDir|fs.ModeSymlink|fs.ModeNamedPipe|fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice),
		IsDir: fi.IsDir(), ModTime: fi.ModTime(),
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		info.Symlink, _ = root.Readlink(rel)
	}
	return info
}

// Mkdir implements roche.FileSystem: the directory and any missing parents; one that
// exists already is fine.
func (p *Provider) Mkdir(ctx context.Context, id, guest string) error {
	t, err := p.fileTarget(ctx, id, guest)
	if err != nil {
		return err
	}
	root, err := t.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if fi, err := root.Lstat(t.relOrDot()); err == nil {
		if fi.IsDir() {
			return nil
		}
		return fmt.Errorf("%w: %s exists and is not a directory", roche.ErrInvalidConfig, t.guest)
	}
	if err := t.writable(); err != nil {
		return err
	}
	return t.err(root.MkdirAll(t.rel, 0o755))
}

// Remove implements roche.FileSystem: the path and, for a directory, everything below it.
func (p *Provider) Remove(ctx context.Context, id, guest string) error {
	t, err := p.fileTarget(ctx, id, guest)
	if err != nil {
		return err
	}
	if err := t.structural("remove"); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	root, err := t.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if _, err := t.lstat(root, true); err != nil {
		return err
	}
	if err := root.RemoveAll(t.rel); err != nil {
		// Directories the guest made read-only (chmod 0500) keep their entries: open
		// them up and try again.
		if sub, err := root.OpenRoot(t.rel); err == nil {
			_ = fs.WalkDir(sub.FS(), ".", func(p string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					_ = sub.Chmod(p, 0o700)
				}
				return nil
			})
			sub.Close()
		}
		return t.err(root.RemoveAll(t.rel))
	}
	return nil
}

// Rename implements roche.FileSystem. Both paths must be in the same directory of the
// sandbox (/tmp, /workspace, /, or one mount), as a rename across file systems cannot
// be done in one step.
func (p *Provider) Rename(ctx context.Context, id, from, to string) error {
	src, err := p.fileTarget(ctx, id, from)
	if err != nil {
		return err
	}
	dst, err := p.fileTarget(ctx, id, to)
	if err != nil {
		return err
	}
	for _, t := range []fileTarget{src, dst} {
		if err := t.structural("rename"); err != nil {
			return err
		}
		if err := t.writable(); err != nil {
			return err
		}
	}
	if src.m.guest != dst.m.guest {
		return fmt.Errorf("%w: %s and %s are in different directories of wasm sandbox %s (%s and %s): copy, then remove",
			roche.ErrUnsupported, src.guest, dst.guest, id, src.m.guest, dst.m.guest)
	}
	root, err := src.root()
	if err != nil {
		return err
	}
	defer root.Close()
	if _, err := src.lstat(root, true); err != nil {
		return err
	}
	if err := root.Rename(src.rel, dst.rel); err != nil {
		return dst.err(err)
	}
	return nil
}
