//go:build linux

package imagefs

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestUnpackKeepsWhatABootNeeds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("keeping owners and making device nodes needs root (the README's test command runs as root)")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(1700000000, 0)
	add := func(h *tar.Header, body string) {
		h.ModTime = mtime
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	// A layer's root says how its builder's directory was (roche/python:local's is 0700):
	// the tree's root keeps its own mode, or no sandbox user could enter it.
	add(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o700}, "")
	add(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o555}, "")
	add(&tar.Header{Name: "bin/su", Typeflag: tar.TypeReg, Mode: 0o4755, PAXRecords: map[string]string{"SCHILY.xattr.user.roche": "x"}}, "#!/bin/sh\n")
	add(&tar.Header{Name: "bin/su-link", Typeflag: tar.TypeLink, Linkname: "bin/su"}, "")
	add(&tar.Header{Name: "home/u/file", Typeflag: tar.TypeReg, Mode: 0o640, Uid: 1000, Gid: 1001}, "data")
	add(&tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, "")
	add(&tar.Header{Name: "lib", Typeflag: tar.TypeSymlink, Linkname: "usr/lib"}, "")
	tw.Close()
	dir := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rep, err := Unpack(&buf, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Files != 2 || rep.Dirs != 1 || rep.HardLinks != 1 || rep.Links != 1 || rep.Nodes != 1 {
		t.Errorf("report %+v, want 2 files, a directory, a hard link, a symlink and a device", rep)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the root is %v (%v), want the 0755 it was given", fi.Mode(), err)
	}
	fi, err := os.Stat(filepath.Join(dir, "bin/su"))
	if err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/su: %v %v, want setuid 0755", fi.Mode(), err)
	}
	buf2 := make([]byte, 16)
	if n, err := unix.Getxattr(filepath.Join(dir, "bin/su"), "user.roche", buf2); err != nil && !errors.Is(err, unix.ENOTSUP) || err == nil && string(buf2[:n]) != "x" {
		t.Errorf("bin/su's extended attribute user.roche: %q %v, want x", buf2[:max(n, 0)], err)
	}
	if !fi.ModTime().Equal(mtime) {
		t.Errorf("mtime %v, want %v", fi.ModTime(), mtime)
	}
	if l, err := os.Stat(filepath.Join(dir, "bin/su-link")); err != nil || !os.SameFile(fi, l) {
		t.Errorf("hard link not kept: %v", err)
	}
	if st := statT(t, filepath.Join(dir, "home/u/file")); st.Uid != 1000 || st.Gid != 1001 {
		t.Errorf("owner %d:%d, want 1000:1001", st.Uid, st.Gid)
	}
	if st := statT(t, filepath.Join(dir, "dev/null")); st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != 0x103 {
		t.Errorf("dev/null mode %o rdev %x", st.Mode, st.Rdev)
	}
	if l, err := os.Readlink(filepath.Join(dir, "lib")); err != nil || l != "usr/lib" {
		t.Errorf("symlink lib -> %q %v", l, err)
	}
	if d, _ := os.Stat(filepath.Join(dir, "bin")); d.Mode().Perm() != 0o555 {
		t.Errorf("bin is %v, want 0555 (applied after its entries)", d.Mode())
	}
}

func statT(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

// TestUnpackRefusesEscapes: an image is untrusted; no entry may write outside the
// tree, through "..", an absolute name, or a symlink an earlier entry planted.
func TestUnpackRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	for name, entries := range map[string][]tar.Header{
		"symlink parent": {
			{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644},
		},
		"relative symlink parent": {
			{Name: "a", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../../.." + outside},
			{Name: "a/evil", Typeflag: tar.TypeReg, Mode: 0o644},
		},
		"dot-dot": {{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644}},
		"hard link out": {
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "h", Typeflag: tar.TypeLink, Linkname: "l/x"},
		},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			h.Size = 0
			tw.WriteHeader(&h)
		}
		tw.Close()
		if _, err := Unpack(&buf, t.TempDir(), true); err == nil {
			t.Errorf("%s: extracted without error", name)
		}
	}
	if left, _ := os.ReadDir(outside); len(left) > 0 {
		t.Fatalf("files written outside the tree: %v", left)
	}
	// An absolute name stays inside.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: outside + "/abs", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	dir := t.TempDir()
	if _, err := Unpack(&buf, dir, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, outside, "abs")); err != nil {
		t.Fatalf("absolute entry not placed inside: %v", err)
	}
	if left, _ := os.ReadDir(outside); len(left) > 0 {
		t.Fatalf("files written outside the tree: %v", left)
	}
}
