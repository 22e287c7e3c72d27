package wasm

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// oneByteReader hands out one byte per Read, so a stream is never read in one piece.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	return o.r.Read(b[:1])
}

func TestFileSystem(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	ctx := ctxFor(t, 2*time.Minute)

	// Binary content, streamed in and out, parents made.
	data := make([]byte, 8<<20+3)
	rand.Read(data)
	if err := tp.WriteFile(ctx, id, "/workspace/a/b/blob.bin", bytes.NewReader(data), 0o600); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	var out bytes.Buffer
	if err := tp.ReadFile(ctx, id, "/workspace/a/b/blob.bin", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("ReadFile: %v, %d bytes back of %d", err, out.Len(), len(data))
	}
	// The sandboxed code sees what was written, and the files API what it writes.
	sum := sha256.Sum256(data)
	if got := pyOK(t, id, "import hashlib; print(hashlib.sha256(open('a/b/blob.bin', 'rb').read()).hexdigest())"); got != hexOf(sum[:]) {
		t.Fatalf("sha256 inside %s, want %x", got, sum)
	}
	pyOK(t, id, "open('/tmp/from-guest.txt', 'w').write('guest\\n')")
	out.Reset()
	if err := tp.ReadFile(ctx, id, "/tmp/from-guest.txt", &out); err != nil || out.String() != "guest\n" {
		t.Fatalf("reading what the guest wrote: %q %v", out.String(), err)
	}
	// A small write in tiny pieces replaces the file whole.
	if err := tp.WriteFile(ctx, id, "/workspace/a/b/blob.bin", oneByteReader{strings.NewReader("short")}, 0); err != nil {
		t.Fatal(err)
	}
	fi, err := tp.Stat(ctx, id, "/workspace/a/b/blob.bin")
	if err != nil || fi.Size != 5 || fi.IsDir || fi.Mode != 0o644 || fi.Name != "blob.bin" || fi.Path != "/workspace/a/b/blob.bin" {
		t.Fatalf("Stat after rewrite: %+v %v", fi, err)
	}

	if err := tp.Mkdir(ctx, id, "/tmp/x/y/z"); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	if err := tp.Mkdir(ctx, id, "/tmp/x/y/z"); err != nil {
		t.Fatalf("Mkdir of an existing directory: %v", err)
	}
	list, err := tp.ListDir(ctx, id, "/workspace/a")
	if err != nil || len(list) != 1 || list[0].Name != "b" || !list[0].IsDir || list[0].Mode&fs.ModeDir == 0 || list[0].Path != "/workspace/a/b" {
		t.Fatalf("ListDir /workspace/a: %+v %v", list, err)
	}
	list, err = tp.ListDir(ctx, id, "/")
	if err != nil || names(list) != "tmp workspace" {
		t.Fatalf("ListDir /: %+v %v", list, err)
	}
	if fi, err := tp.Stat(ctx, id, "/"); err != nil || !fi.IsDir || fi.Name != "/" {
		t.Fatalf("Stat /: %+v %v", fi, err)
	}

	if err := tp.Rename(ctx, id, "/workspace/a/b/blob.bin", "/workspace/moved.bin"); err != nil {
		t.Fatalf("Rename: %v", err)
	}
	if _, err := tp.Stat(ctx, id, "/workspace/a/b/blob.bin"); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("old name after rename: %v", err)
	}
	if got := pyOK(t, id, "print(open('/workspace/moved.bin').read())"); got != "short" {
		t.Fatalf("renamed file inside: %q", got)
	}
	if err := tp.Remove(ctx, id, "/workspace/a"); err != nil {
		t.Fatalf("Remove of a tree: %v", err)
	}
	if _, err := tp.Stat(ctx, id, "/workspace/a"); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("removed tree: %v", err)
	}
	// A directory the guest made read-only is still removed whole.
	pyOK(t, id, "import os; os.makedirs('/tmp/ro/sub'); open('/tmp/ro/sub/f', 'w').write('x'); os.chmod('/tmp/ro/sub', 0o500); os.chmod('/tmp/ro', 0o500)")
	if err := tp.Remove(ctx, id, "/tmp/ro"); err != nil {
		t.Fatalf("Remove of a read-only tree: %v", err)
	}
}

func TestFileSystemRefuses(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	mnt := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(mnt, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(secret), filepath.Join(mnt, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "plain"), []byte("in mount"), 0o644); err != nil {
		t.Fatal(err)
	}
	rw := t.TempDir()
	id := newSandbox(t, func(c *roche.Config) {
		c.Mounts = []roche.Mount{{Source: mnt, Target: "/mnt/ro"}, {Source: rw, Target: "/mnt/rw", ReadWrite: true}}
	})
	ctx := ctxFor(t, time.Minute)
	w := func(p string) error { return tp.WriteFile(ctx, id, p, strings.NewReader("x"), 0o644) }
	r := func(p string) error { return tp.ReadFile(ctx, id, p, io.Discard) }

	for _, c := range []struct {
		what string
		err  error
		want error
	}{
		{"relative path", r("workspace/x"), roche.ErrInvalidConfig},
		{"..", r("/workspace/../etc/passwd"), roche.ErrInvalidConfig},
		{".. at the root", w("/../../tmp/x"), roche.ErrInvalidConfig},
		{"read a symlink", r("/mnt/ro/link"), roche.ErrPermission},
		{"read through a symlinked dir", r("/mnt/ro/dirlink/secret"), roche.ErrPermission},
		{"list through a symlinked dir", func() error { _, err := tp.ListDir(ctx, id, "/mnt/ro/dirlink"); return err }(), roche.ErrPermission},
		{"write on the read-only root", w("/etc/x"), roche.ErrPermission},
		{"write in a read-only mount", w("/mnt/ro/new"), roche.ErrPermission},
		{"remove in a read-only mount", tp.Remove(ctx, id, "/mnt/ro/plain"), roche.ErrPermission},
		{"mkdir on the read-only root", tp.Mkdir(ctx, id, "/srv"), roche.ErrPermission},
		{"the standard library", r("/usr/local/lib/python3.12/os.py"), roche.ErrUnsupported},
		{"remove /tmp itself", tp.Remove(ctx, id, "/tmp"), roche.ErrPermission},
		{"rename across directories", func() error {
			if err := w("/tmp/across"); err != nil {
				return err
			}
			return tp.Rename(ctx, id, "/tmp/across", "/workspace/across")
		}(), roche.ErrUnsupported},
		{"read a missing file", r("/tmp/none"), roche.ErrNotFound},
		{"remove a missing file", tp.Remove(ctx, id, "/tmp/none"), roche.ErrNotFound},
		{"read a directory", r("/tmp"), roche.ErrInvalidConfig},
		{"write over a directory", func() error { _ = tp.Mkdir(ctx, id, "/tmp/d"); return w("/tmp/d") }(), roche.ErrInvalidConfig},
		{"unknown sandbox", tp.ReadFile(ctx, "wasm-000000000000", "/tmp/x", io.Discard), roche.ErrNotFound},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, c.err, c.want)
		}
	}
	// Through a symlink nothing reached the host file.
	if b, _ := os.ReadFile(secret); string(b) != "host secret" {
		t.Fatalf("host file changed: %q", b)
	}
	// A symlink in a mount is described, not followed; a read-write mount takes writes.
	if fi, err := tp.Stat(ctx, id, "/mnt/ro/link"); err != nil || fi.Symlink != secret || fi.Mode&fs.ModeSymlink == 0 {
		t.Fatalf("Stat of a symlink: %+v %v", fi, err)
	}
	if err := w("/mnt/rw/sub/new"); err != nil {
		t.Fatalf("write in a read-write mount: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "sub", "new")); err != nil || string(b) != "x" {
		t.Fatalf("on the host: %q %v", b, err)
	}
	var out bytes.Buffer
	if err := tp.ReadFile(ctx, id, "/mnt/ro/plain", &out); err != nil || out.String() != "in mount" {
		t.Fatalf("read in a read-only mount: %q %v", out.String(), err)
	}
}

// TestFileSystemCancelledUpload: an upload cut short leaves the old file, not a part.
func TestFileSystemCancelledUpload(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	ctx := ctxFor(t, time.Minute)
	if err := tp.WriteFile(ctx, id, "/tmp/keep", strings.NewReader("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	failing := io.MultiReader(strings.NewReader("partial new content"), errReader{})
	if err := tp.WriteFile(ctx, id, "/tmp/keep", failing, 0o644); err == nil {
		t.Fatal("a failed upload reported success")
	}
	var out bytes.Buffer
	if err := tp.ReadFile(ctx, id, "/tmp/keep", &out); err != nil || out.String() != "old" {
		t.Fatalf("after a failed upload: %q %v", out.String(), err)
	}
	if list, err := tp.ListDir(ctx, id, "/tmp"); err != nil || names(list) != "keep" {
		t.Fatalf("/tmp after a failed upload: %+v %v", list, err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection lost") }

func names(list []roche.FileInfo) string {
	var n []string
	for _, fi := range list {
		n = append(n, fi.Name)
	}
	return strings.Join(n, " ")
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}
