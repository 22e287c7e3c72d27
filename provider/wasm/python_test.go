package wasm

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestPythonDigestRecord: a process records that python.wasm had the pinned digest, and
// the next one reads that record instead of hashing the 26 MB again, only for the same
// version of the file. The attack: python.wasm replaced in place by a module of someone
// else's, with its mtime set back, is hashed again (its ctime, which only the kernel
// sets, moved) and refused; a record planted for the new version is honoured only when
// private to this user, never one another local user wrote or may write. A record of
// this user's own, 0600, for the new version is honoured, which shows the test sees a
// planted record when one gets through.
func TestPythonDigestRecord(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm, testenv.Root)
	src, _ := tp.PythonPath()
	cache, state := t.TempDir(), t.TempDir()
	path := filepath.Join(cache, PythonFile)
	if out, err := exec.Command("cp", src, path).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	open := func() *Provider {
		t.Helper()
		p, err := New(WithCacheDir(cache), WithStateDir(state))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	if _, err := open().readPython(path, true); err != nil {
		t.Fatalf("the pinned python.wasm: %v", err)
	}
	record := filepath.Join(state, verifiedFile)
	fi, err := os.Lstat(record)
	if err != nil {
		t.Fatalf("no record of the digest: %v", err)
	}
	if fi.Mode().Perm() != 0o600 || !fi.Mode().IsRegular() {
		t.Errorf("the record's mode %v, want a regular file, 0600", fi.Mode())
	}
	if _, err := open().readPython(path, true); err != nil {
		t.Fatalf("the pinned python.wasm, recorded: %v", err)
	}

	// Replaced in place: one byte of its last section (the name section) changed, its
	// mtime set back.
	orig, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := f.ReadAt(b[:], orig.Size()-1); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if _, err := f.WriteAt(b[:], orig.Size()-1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(path, orig.ModTime(), orig.ModTime()); err != nil {
		t.Fatal(err)
	}
	refused := func(t *testing.T) {
		t.Helper()
		_, err := open().readPython(path, true)
		if err == nil || !strings.Contains(err.Error(), "has sha256") {
			t.Fatalf("a python.wasm not the pinned one: %v, want its digest refused", err)
		}
	}
	refused(t)

	// Records for the replaced file, as its replacer would plant them.
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	planted, _ := json.Marshal(verifiedStamp{Path: path, Stamp: fileStamp(after), SHA256: pythonSHA256})
	_, uid, gid := testenv.LocalUser(t, "rochewasm")
	for _, c := range []struct {
		name  string
		plant func(t *testing.T)
	}{
		{"another user's", func(t *testing.T) {
			writeAs(t, record, planted, 0o600)
			if err := os.Chown(record, uid, gid); err != nil {
				t.Fatal(err)
			}
		}},
		{"writable by others", func(t *testing.T) { writeAs(t, record, planted, 0o666) }},
		{"readable by the group", func(t *testing.T) { writeAs(t, record, planted, 0o640) }},
		{"a link", func(t *testing.T) {
			elsewhere := filepath.Join(t.TempDir(), "record")
			writeAs(t, elsewhere, planted, 0o600)
			os.Remove(record)
			if err := os.Symlink(elsewhere, record); err != nil {
				t.Fatal(err)
			}
		}},
		{"in a directory others may write", func(t *testing.T) {
			writeAs(t, record, planted, 0o600)
			if err := os.Chmod(state, 0o777); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Chmod(state, 0o700) })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.plant(t)
			_, err := readPythonIn(t, cache, state, path)
			if err == nil || !strings.Contains(err.Error(), "has sha256") {
				t.Fatalf("a planted record (%s) was honoured: %v", c.name, err)
			}
		})
	}
	t.Run("control: this user's own record", func(t *testing.T) {
		os.Chmod(state, 0o700)
		writeAs(t, record, planted, 0o600)
		if _, err := readPythonIn(t, cache, state, path); err != nil {
			t.Fatalf("this user's own record was not honoured (%v): the cases above prove nothing", err)
		}
	})
}

// readPythonIn reads python.wasm with a provider of its own: New's state directory
// check would make a loose directory private again, which the attack's case must keep.
func readPythonIn(t *testing.T, cache, state, path string) ([]byte, error) {
	t.Helper()
	p := &Provider{cacheDir: cache, stateDir: state, log: tp.log}
	return p.readPython(path, true)
}

// writeAs replaces path with content and gives it mode.
func writeAs(t *testing.T, path string, content []byte, mode os.FileMode) {
	t.Helper()
	os.Remove(path)
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}
