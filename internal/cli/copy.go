package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/tarfs"
)

// roche cp's DST, as cp and docker cp read it: a directory that exists, or a path ending
// with /, is where SRC goes under its own name.

// intoHostDir is the host path a copy out of the sandbox path src writes: inside dst,
// under src's name, when dst ends with a separator or is a directory (not a symlink to
// one: nothing at dst is followed), else dst itself.
func intoHostDir(src, dst string) string {
	name := path.Base(path.Clean(src))
	if strings.HasSuffix(dst, "/") || strings.HasSuffix(dst, string(filepath.Separator)) {
		return filepath.Join(dst, name)
	}
	if fi, err := os.Lstat(dst); err == nil && fi.IsDir() {
		return filepath.Join(dst, name)
	}
	return dst
}

// intoSandboxDir is the sandbox path a copy of the host path src writes: inside dst,
// under src's name, when dst ends with / or is a directory in the sandbox, else dst
// itself. The sandbox answers whether it is one, so it may lie; it can only move the copy
// elsewhere inside itself.
func intoSandboxDir(ctx context.Context, p roche.Provider, tc roche.TarCopier, id, src, dst string) (string, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", err
	}
	name := filepath.Base(abs)
	if strings.HasSuffix(dst, "/") {
		return path.Join(dst, name), nil
	}
	dir, err := sandboxIsDir(ctx, p, tc, id, dst)
	if err != nil {
		return "", err
	}
	if dir {
		return path.Join(dst, name), nil
	}
	return dst, nil
}

// errProbed ends a probe's tar stream once its first header is read.
var errProbed = errors.New("probed")

// sandboxIsDir reports whether the sandbox path p is a directory (a missing one is
// not): with the provider's Stat where it has one, else (through roched) from the first
// header of the path's tar stream, the rest of which is not read.
func sandboxIsDir(ctx context.Context, p roche.Provider, tc roche.TarCopier, id, name string) (bool, error) {
	if fsys, ok := p.(roche.FileSystem); ok {
		fi, err := fsys.Stat(ctx, id, name)
		if errors.Is(err, roche.ErrNotFound) {
			return false, nil
		}
		return err == nil && fi.IsDir, err
	}
	dir := false
	err := tarfs.PipeFrom(ctx, tc, id, name, func(r io.Reader) error {
		hdr, err := tar.NewReader(r).Next()
		if err != nil {
			return err
		}
		dir = hdr.Typeflag == tar.TypeDir
		return errProbed
	})
	switch {
	case err == nil, errors.Is(err, errProbed):
		return dir, nil
	case errors.Is(err, roche.ErrNotFound):
		return false, nil
	}
	return false, fmt.Errorf("looking at %s in sandbox %s: %w", name, id, err)
}
