//go:build unix

package statedir

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReadPrivate: what ReadPrivate and MapPrivate refuse (a link, a file others may
// read or write, a second name, one over the limit, one in a directory others may
// write) and what they read (WritePrivate's, 0600, written in parts).
func TestReadPrivate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "entry")
	if err := WritePrivate(file, []byte("ke"), nil, []byte("pt")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("WritePrivate's file: %v %v, want mode 0600", fi.Mode(), err)
	}
	if b, err := readBoth(t, file, 4); err != nil || string(b) != "kept" {
		t.Fatalf("ReadPrivate: %q %v", b, err)
	}
	if _, err := readBoth(t, file, 3); err == nil {
		t.Error("a file over the limit was read")
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	if _, err := readBoth(t, link, 4); err == nil {
		t.Error("a symbolic link was followed")
	}
	second := filepath.Join(dir, "second")
	if err := os.Link(file, second); err != nil {
		t.Fatal(err)
	}
	if _, err := readBoth(t, file, 4); err == nil {
		t.Error("a file with a second name was read")
	}
	os.Remove(second)
	for _, mode := range []os.FileMode{0o640, 0o604, 0o620, 0o666} {
		os.Chmod(file, mode)
		if _, err := readBoth(t, file, 4); err == nil {
			t.Errorf("a file of mode %v was read", mode)
		}
	}
	os.Chmod(file, 0o600)
	os.Chmod(dir, 0o777)
	defer os.Chmod(dir, 0o700)
	if _, err := readBoth(t, file, 4); err == nil {
		t.Error("a file in a directory others may write was read")
	}
}

// readBoth reads path with ReadPrivate and MapPrivate, which must agree.
func readBoth(t *testing.T, path string, limit int64) ([]byte, error) {
	t.Helper()
	b, err := ReadPrivate(path, limit)
	m, mapping, merr := MapPrivate(path, limit)
	if (err == nil) != (merr == nil) {
		t.Fatalf("ReadPrivate: %v; MapPrivate: %v", err, merr)
	}
	if merr == nil {
		if string(m) != string(b) {
			t.Fatalf("MapPrivate mapped %q, ReadPrivate read %q", m, b)
		}
		mapping.Unmap()
		mapping.Unmap() // again: nothing
	}
	return b, err
}
