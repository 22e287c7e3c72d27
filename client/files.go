package client

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/tarfs"
)

// WriteFile writes r to the absolute sandbox path, replacing it and creating missing
// parents, as roche.FileSystem's WriteFile does in-process. The daemon's API moves files
// as tar streams (CopyTo), so the content is staged in a temporary file first, which
// gives the tar entry its size.
func (p *Provider) WriteFile(ctx context.Context, id, dst string, r io.Reader, mode fs.FileMode) error {
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return fmt.Errorf("%w: path %q must be an absolute path below /, e.g. /tmp/data.txt", roche.ErrInvalidConfig, dst)
	}
	dir, err := os.MkdirTemp("", "roche-write-")
	if err != nil {
		return fmt.Errorf("staging the file for sandbox %s: %w", id, err)
	}
	defer os.RemoveAll(dir)
	local := filepath.Join(dir, path.Base(dst))
	f, err := os.OpenFile(local, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode.Perm())
	if err != nil {
		return fmt.Errorf("staging the file for sandbox %s: %w", id, err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("reading the content for %s: %w", dst, err)
	}
	// The file's mode, not the umask's leftover, is what the sandbox gets.
	if err := os.Chmod(local, mode.Perm()); err != nil {
		return err
	}
	return p.CopyTo(ctx, id, local, dst)
}

// ReadFile streams the sandbox file at src to w, as roche.FileSystem's ReadFile does
// in-process, refusing a file over roche.DefaultCopyMaxBytes (see ReadFileLimit). A
// directory is refused: CopyFrom copies those.
func (p *Provider) ReadFile(ctx context.Context, id, src string, w io.Writer) error {
	return p.ReadFileLimit(ctx, id, src, w, 0)
}

// ReadFileLimit is ReadFile with a cap on the file's size, checked before any of its
// content is read; 0 means roche.DefaultCopyMaxBytes. The daemon's own cap (roched
// --copy-max-bytes) applies too. A file over the cap is ErrExhausted.
func (p *Provider) ReadFileLimit(ctx context.Context, id, src string, w io.Writer, maxBytes int64) error {
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return fmt.Errorf("%w: path %q must be an absolute path below /, e.g. /tmp/data.txt", roche.ErrInvalidConfig, src)
	}
	opts := roche.CopyOptions{MaxBytes: maxBytes}
	oc := &optionCopier{p: p, opts: opts}
	err := tarfs.PipeFrom(ctx, oc, id, src, func(r io.Reader) error { return singleFile(r, src, w, opts.Limit()) })
	if errors.Is(err, tarfs.ErrEmpty) && oc.skipped.SkippedLinks > 0 {
		return fmt.Errorf("%w: %s is a symlink, which the files API does not follow: read what it points to", roche.ErrPermission, src)
	}
	return err
}

// singleFile copies the content of the tar stream's first entry, which must be a
// regular file of at most limit bytes, to w.
func singleFile(r io.Reader, src string, w io.Writer, limit int64) error {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("reading %s: %w", src, tarfs.ErrEmpty)
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	switch hdr.Typeflag {
	case tar.TypeReg:
	case tar.TypeDir:
		return fmt.Errorf("%w: %s is a directory: ReadFile reads files; CopyFrom copies directories", roche.ErrInvalidConfig, src)
	default:
		return fmt.Errorf("%w: %s is not a regular file", roche.ErrInvalidConfig, src)
	}
	if hdr.Size > limit {
		return fmt.Errorf("%w: %s is %s, over the %s one read may move: read less, or raise the cap (ReadFileLimit, max_bytes= in the SDK)",
			roche.ErrExhausted, src, size.String(hdr.Size), size.String(limit))
	}
	if _, err := io.Copy(w, tr); err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	return nil
}
