package wasm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/tarfs"
)

// CopyTo implements roche.FileCopier with the default options (see roche.CopyIn).
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyIn(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyFrom implements roche.FileCopier with the default options (see roche.CopyOut).
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyOut(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyTarTo implements roche.TarCopier: the archive's root entry becomes dst in the
// sandbox, parent directories created. dst must be in a writable directory of the
// sandbox (/tmp, /workspace, a rw mount, or anywhere with writable=true). The archive is
// unpacked into the host directory behind dst without following any symlink there, and
// symbolic links in it are refused rather than made, since the sandbox must not hold any.
func (p *Provider) CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error {
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
	mounts, err := p.sandboxMounts(id, rec.Config)
	if err != nil {
		return fmt.Errorf("copying into wasm sandbox %s: %w", id, err)
	}
	m, rel := resolve(mounts, dst)
	if rel == "" {
		return fmt.Errorf("%w: %s is a directory the sandbox is made of: copy to a path below it, e.g. %s/data", roche.ErrInvalidConfig, dst, dst)
	}
	if m.readOnly {
		hint := "copy into /tmp or /workspace, or create the sandbox with writable=true"
		if !m.own {
			hint = "it is in a read-only mount of " + m.host
		}
		return fmt.Errorf("%w: %s is read-only in wasm sandbox %s: %s", roche.ErrUnsupported, dst, id, hint)
	}
	dir, err := os.Open(m.host)
	if err != nil {
		return fmt.Errorf("%w: copying into wasm sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	defer dir.Close()
	if _, err := tarfs.ExtractAt(ctxReader{ctx, r}, dir, rel, tarfs.Options{Links: tarfs.RefuseLinks}); err != nil {
		return fmt.Errorf("copying into wasm sandbox %s at %s: %w", id, dst, copyErr(err))
	}
	return nil
}

// CopyTarFrom implements roche.TarCopier: src is read from the host directory behind it,
// never through a symlink, and written to w as a tar stream. A symlink (one a host
// mount holds) is sent as a symlink.
func (p *Provider) CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error {
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
	dir, err := os.Open(m.host)
	if err != nil {
		return fmt.Errorf("%w: copying out of wasm sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	defer dir.Close()
	if _, err := tarfs.WriteAt(w, dir, rel, path.Base(src), tarfs.Options{}); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: no %s in wasm sandbox %s", roche.ErrNotFound, src, id)
		}
		return fmt.Errorf("copying %s out of wasm sandbox %s: %w", src, id, copyErr(err))
	}
	return nil
}

// copyErr gives an error of the sandbox's side of a copy its sentinel.
func copyErr(err error) error {
	switch {
	case errors.Is(err, tarfs.ErrLinkRefused):
		return fmt.Errorf("%w: %v: wasm sandboxes hold no symbolic links; copy what it points to", roche.ErrUnsupported, err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: no space left: the sandbox's disk or /tmp is full: %v", roche.ErrExhausted, err)
	case errors.Is(err, tarfs.ErrUnsafe):
		return fmt.Errorf("%w: %v", roche.ErrPermission, err)
	case errors.Is(err, tarfs.ErrNotDir), errors.Is(err, tarfs.ErrIsDir):
		return fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
	}
	return err
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
