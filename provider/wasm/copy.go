package wasm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/roche-sandbox/roche"
)

// CopyTo implements roche.FileCopier: the host file or directory src becomes dst in the
// sandbox, parent directories created. dst must be in a writable directory of the
// sandbox (/tmp, /workspace, a rw mount, or anywhere with writable=true). Symbolic links
// are refused rather than copied, since the sandbox must not hold any.
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	rec, err := p.lookup(id)
	if err != nil {
		return err
	}
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return fmt.Errorf("%w: destination %q must be an absolute path below /", roche.ErrInvalidConfig, dst)
	}
	dst = path.Clean(dst)
	if within(dst, guestStdlib) || within(dst, guestBoot) {
		return fmt.Errorf("%w: %s is inside python.wasm's read-only standard library in wasm sandboxes: copy into /tmp or /workspace", roche.ErrUnsupported, dst)
	}
	if _, err := os.Lstat(src); err != nil {
		return fmt.Errorf("%w: host path %s: %v", roche.ErrNotFound, src, err)
	}
	mounts, err := p.sandboxMounts(id, rec.Config)
	if err != nil {
		return fmt.Errorf("copying %s into wasm sandbox %s: %w", src, id, err)
	}
	m, rel := resolve(mounts, dst)
	if rel == "" {
		return fmt.Errorf("%w: %s is a directory the sandbox is made of: copy to a path below it, e.g. %s/%s", roche.ErrInvalidConfig, dst, dst, filepath.Base(src))
	}
	if m.readOnly {
		hint := "copy into /tmp or /workspace, or create the sandbox with writable=true"
		if !m.own {
			hint = "it is in a read-only mount of " + m.host
		}
		return fmt.Errorf("%w: %s is read-only in wasm sandbox %s: %s", roche.ErrUnsupported, dst, id, hint)
	}
	root, err := os.OpenRoot(m.host)
	if err != nil {
		return fmt.Errorf("%w: copying into wasm sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	defer root.Close()
	if parent := path.Dir(rel); parent != "." {
		if err := root.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("copying %s into wasm sandbox %s: making %s: %w", src, id, path.Dir(dst), err)
		}
	}
	if err := copyIn(ctx, root, src, rel); err != nil {
		return fmt.Errorf("copying %s into wasm sandbox %s at %s: %w", src, id, dst, err)
	}
	return nil
}

// copyIn copies the host path src to rel inside root.
func copyIn(ctx context.Context, root *os.Root, src, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode().IsRegular():
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, ctxReader{ctx, in}); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	case fi.IsDir():
		if err := root.Mkdir(rel, fi.Mode().Perm()|0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := copyIn(ctx, root, filepath.Join(src, e.Name()), path.Join(rel, e.Name())); err != nil {
				return err
			}
		}
		return nil
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link, and wasm sandboxes hold none: copy what it points to", roche.ErrUnsupported, src)
	}
	return fmt.Errorf("%w: %s is neither a regular file nor a directory", roche.ErrUnsupported, src)
}

// CopyFrom implements roche.FileCopier: the sandbox path src becomes the host path dst.
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	rec, err := p.lookup(id)
	if err != nil {
		return err
	}
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return fmt.Errorf("%w: source %q must be an absolute path below /", roche.ErrInvalidConfig, src)
	}
	src = path.Clean(src)
	mounts, err := p.sandboxMounts(id, rec.Config)
	if err != nil {
		return fmt.Errorf("copying %s out of wasm sandbox %s: %w", src, id, err)
	}
	m, rel := resolve(mounts, src)
	if rel == "" {
		rel = "."
	}
	root, err := os.OpenRoot(m.host)
	if err != nil {
		return fmt.Errorf("%w: copying out of wasm sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	defer root.Close()
	if _, err := root.Lstat(rel); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: no %s in wasm sandbox %s", roche.ErrNotFound, src, id)
		}
		return fmt.Errorf("copying %s out of wasm sandbox %s: %w", src, id, err)
	}
	if parent := filepath.Dir(dst); parent != "" {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return fmt.Errorf("copying %s out of wasm sandbox %s: %w", src, id, err)
		}
	}
	if err := copyOut(ctx, root, rel, dst); err != nil {
		return fmt.Errorf("copying %s out of wasm sandbox %s to %s: %w", src, id, dst, err)
	}
	return nil
}

// copyOut copies rel inside root to the host path dst. Modes keep only permission bits:
// whatever the guest set, nothing setuid comes out.
func copyOut(ctx context.Context, root *os.Root, rel, dst string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fi, err := root.Lstat(rel)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode().IsRegular():
		in, err := root.Open(rel)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm()|0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, ctxReader{ctx, in}); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()|0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		d, err := root.Open(rel)
		if err != nil {
			return err
		}
		entries, err := d.ReadDir(-1)
		d.Close()
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := copyOut(ctx, root, path.Join(rel, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		return nil
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link (from a host mount); copy what it points to", roche.ErrUnsupported, rel)
	}
	return fmt.Errorf("%w: %s is neither a regular file nor a directory", roche.ErrUnsupported, rel)
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}
