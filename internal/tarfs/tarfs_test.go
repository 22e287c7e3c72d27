package tarfs

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRoundTripDirectory(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "b", "f.bin"), []byte{0, 1, 2, 255}, 0o600)
	os.WriteFile(filepath.Join(src, "empty"), nil, 0o644)
	os.Symlink("a/b/f.bin", filepath.Join(src, "link"))
	var buf bytes.Buffer
	if err := Write(&buf, src, "root"); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "out")
	if err := Extract(&buf, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a", "b", "f.bin")); err != nil || !bytes.Equal(b, []byte{0, 1, 2, 255}) {
		t.Fatalf("nested binary file: %v %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || fi.Size() != 0 {
		t.Fatalf("empty file: %v", err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "a/b/f.bin" {
		t.Fatalf("symlink: %q %v", l, err)
	}
}

func archive(t *testing.T, entries ...*tar.Header) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	return &buf
}

func TestExtractRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	cases := map[string]*bytes.Buffer{
		"dotdot":   archive(t, &tar.Header{Name: "../../evil", Typeflag: tar.TypeReg, Mode: 0o644}),
		"absolute": archive(t, &tar.Header{Name: "/etc/evil", Typeflag: tar.TypeReg, Mode: 0o644}),
		"through symlink": archive(t,
			&tar.Header{Name: "root/", Typeflag: tar.TypeDir, Mode: 0o755},
			&tar.Header{Name: "root/link", Typeflag: tar.TypeSymlink, Linkname: outside},
			&tar.Header{Name: "root/link/evil", Typeflag: tar.TypeReg, Mode: 0o644}),
	}
	for name, buf := range cases {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "out")
			err := Extract(buf, dst)
			if err == nil || !strings.Contains(err.Error(), "outside") && !strings.Contains(err.Error(), "symlink") {
				t.Fatalf("Extract: %v, want a refusal", err)
			}
			if _, err := os.Stat(filepath.Join(outside, "evil")); err == nil {
				t.Fatal("a file was written outside the destination")
			}
		})
	}
}
