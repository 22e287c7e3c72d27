//go:build unix

// Package fuzztar serves the fuzz targets of Roche's tar extraction (internal/tarfs for
// copies, and through provider/internal/imagefs the oci provider's images and the
// microVMs' root filesystems): archives built from a short script that the fuzzer
// mutates well (a raw tar's checksums make most mutations of its bytes fail at the first
// header), and the checks every extraction must
// pass whatever the archive held: nothing outside the destination is written, changed
// or hard-linked, nothing is made beside it, and no symlink, hard link, device or fifo
// the caller does not allow is made inside it. Tests only: no production code imports it.
package fuzztar

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// Entry kinds of a script line, by its first byte modulo kinds.
const (
	KindReg = iota
	KindDir
	KindSymlink
	KindHardlink
	KindChar
	KindBlock
	KindFifo
	KindSetuid // a regular file, mode 04755
	kinds
)

// OutsideToken in a script's name or link target is replaced by the absolute path of
// the layout's outside directory, so that a seed can aim an absolute link at a victim.
const OutsideToken = "@OUT@"

// Line is one script line: a kind, an entry name and its argument (a regular file's
// content, a link's target).
func Line(kind byte, name, arg string) string {
	return string([]byte{kind}) + name + "\x00" + arg + "\n"
}

// Build turns a script into a tar archive. A script is lines ('\n'); each line is an
// entry: its first byte is the kind (modulo the number of kinds), the rest "name NUL
// arg". Owners are this process's uid and gid, so that an extractor which keeps owners
// works without root. Entries the tar writer refuses are left out.
func Build(script []byte, outside string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	uid, gid := os.Getuid(), os.Getgid()
	for line := range bytes.SplitSeq(script, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		kind := line[0] % kinds
		name, arg, _ := strings.Cut(string(line[1:]), "\x00")
		name = strings.ReplaceAll(name, OutsideToken, outside)
		arg = strings.ReplaceAll(arg, OutsideToken, outside)
		h := &tar.Header{Name: name, Uid: uid, Gid: gid, Mode: 0o644}
		var body []byte
		switch kind {
		case KindReg, KindSetuid:
			h.Typeflag, h.Size, body = tar.TypeReg, int64(len(arg)), []byte(arg)
			if kind == KindSetuid {
				h.Mode = 0o4755
			}
		case KindDir:
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		case KindSymlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, arg
		case KindHardlink:
			h.Typeflag, h.Linkname = tar.TypeLink, arg
		case KindChar:
			h.Typeflag, h.Devmajor, h.Devminor = tar.TypeChar, 1, 3 // /dev/null's numbers
		case KindBlock:
			h.Typeflag, h.Devmajor, h.Devminor = tar.TypeBlock, 7, 0
		case KindFifo:
			h.Typeflag = tar.TypeFifo
		}
		if tw.WriteHeader(h) != nil {
			// The writer refuses some names; it has written nothing for this entry.
			continue
		}
		if len(body) > 0 {
			_, _ = tw.Write(body)
		}
	}
	_ = tw.Close()
	return buf.Bytes()
}

// Layout is where a fuzzed extraction runs: a private base directory holding the
// destination and, beside it, a victim tree that must come out untouched.
type Layout struct {
	Base    string // mode 0700: setuid files or devices an archive makes reach no one else
	Dst     string // Base/dst: where the archive goes
	Outside string // Base/outside: the victims
	before  map[string]state
	baseIno uint64
}

// state is what Check compares of one file outside.
type state struct {
	mode  fs.FileMode
	nlink uint64
	ino   uint64
	size  int64
	link  string
	sum   [32]byte
	mtime int64
}

// diff names what differs between two states of a file.
func (s state) diff(now state) string {
	var out []string
	add := func(what string, was, is any) {
		if was != is {
			out = append(out, fmt.Sprintf("%s %v, was %v", what, is, was))
		}
	}
	add("mode", s.mode, now.mode)
	add("links", s.nlink, now.nlink)
	add("inode", s.ino, now.ino)
	add("size", s.size, now.size)
	add("symlink to", s.link, now.link)
	if s.sum != now.sum {
		out = append(out, "content")
	}
	add("mtime", s.mtime, now.mtime)
	return strings.Join(out, ", ")
}

// NewLayout makes a layout in a fresh temporary directory; with mkDst the destination
// exists before the extraction (the image extractors write into a directory they are
// given).
func NewLayout(t testing.TB, mkDst bool) *Layout {
	t.Helper()
	base := t.TempDir()
	if err := os.Chmod(base, 0o700); err != nil {
		t.Fatal(err)
	}
	// An archive may leave directories without write or search permission, which a
	// non-root cleanup could not remove.
	t.Cleanup(func() {
		_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if d != nil && d.IsDir() {
				_ = os.Chmod(p, 0o700)
			}
			return nil
		})
	})
	l := &Layout{Base: base, Dst: filepath.Join(base, "dst"), Outside: filepath.Join(base, "outside")}
	for _, d := range []string{l.Outside, filepath.Join(l.Outside, "dir")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range map[string]string{"victim": "victim\n", "dir/file": "nested victim\n"} {
		if err := os.WriteFile(filepath.Join(l.Outside, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("victim", filepath.Join(l.Outside, "link")); err != nil {
		t.Fatal(err)
	}
	if mkDst {
		if err := os.Mkdir(l.Dst, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l.before = snapshot(t, l.Outside)
	l.baseIno = ino(t, base)
	return l
}

func ino(t testing.TB, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func snapshot(t testing.TB, root string) map[string]state {
	t.Helper()
	out := map[string]state{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		s := state{mode: fs.FileMode(st.Mode), nlink: uint64(st.Nlink), ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			s.link, _ = os.Readlink(p)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s.sum = sha256.Sum256(b)
		}
		out[p] = s
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	return out
}

// Check fails the test when the extraction reached outside its destination: a victim
// written, removed, re-linked, re-moded or given a hard link; or anything made in the
// base directory beside the destination.
func (l *Layout) Check(t testing.TB) {
	t.Helper()
	entries, err := os.ReadDir(l.Base)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "dst" && e.Name() != "outside" {
			t.Errorf("the extraction made %s beside its destination", filepath.Join(l.Base, e.Name()))
		}
	}
	if ino(t, l.Base) != l.baseIno {
		t.Errorf("the base directory %s was replaced", l.Base)
	}
	after := snapshot(t, l.Outside)
	for p, was := range l.before {
		now, ok := after[p]
		switch {
		case !ok:
			t.Errorf("victim %s was removed", p)
		case now != was:
			t.Errorf("victim %s changed: %s", p, was.diff(now))
		}
	}
	for p := range after {
		if _, ok := l.before[p]; !ok {
			t.Errorf("the extraction made %s outside its destination", p)
		}
	}
}

// Made is one file the extraction made, as Lstat saw it.
type Made struct {
	Rel  string // slash-separated, below the destination ("" for the destination)
	Mode fs.FileMode
	Link string // a symlink's target
	Size int64
	Ino  uint64
}

// Walk lists what is at and below the destination, following no symlink, and checks
// that no file there is a hard link of a victim outside.
func (l *Layout) Walk(t testing.TB) []Made {
	t.Helper()
	victims := map[uint64]string{}
	for p, s := range l.before {
		if s.mode.IsRegular() {
			victims[s.ino] = p
		}
	}
	var out []Made
	if _, err := os.Lstat(l.Dst); err != nil {
		return nil
	}
	err := filepath.WalkDir(l.Dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(l.Dst, p)
		if rel == "." {
			rel = ""
		}
		m := Made{Rel: filepath.ToSlash(rel), Mode: fs.FileMode(st.Mode), Size: st.Size, Ino: st.Ino}
		m.Mode = modeOf(st.Mode)
		if m.Mode&fs.ModeSymlink != 0 {
			m.Link, _ = os.Readlink(p)
		}
		if v, ok := victims[st.Ino]; ok && m.Mode.IsRegular() {
			t.Errorf("%s is a hard link of %s, outside the destination", p, v)
		}
		out = append(out, m)
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", l.Dst, err)
	}
	return out
}

// modeOf turns a stat mode into an fs.FileMode's type bits.
func modeOf(m uint32) fs.FileMode {
	perm := fs.FileMode(m & 0o777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return perm | fs.ModeDir
	case syscall.S_IFLNK:
		return perm | fs.ModeSymlink
	case syscall.S_IFCHR:
		return perm | fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		return perm | fs.ModeDevice
	case syscall.S_IFIFO:
		return perm | fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		return perm | fs.ModeSocket
	}
	return perm
}

// Special reports whether m is none of a regular file, a directory or a symlink.
func Special(m fs.FileMode) bool {
	return m&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket|fs.ModeIrregular) != 0
}

// StaysInside reports whether a symlink standing in the directory dir (its components
// below a root) with the given target resolves at or below that root, following every
// symlink on the way as the kernel would; lookup reports whether a path (components
// below the root) is a symlink, and its target. A missing component is taken as a name;
// a loop resolves to nothing and so reaches nothing.
func StaysInside(dir []string, target string, lookup func(p []string) (string, bool)) bool {
	if target == "" || path.IsAbs(target) {
		return false
	}
	cur := append([]string(nil), dir...)
	todo := strings.Split(target, "/")
	for hops := 0; len(todo) > 0; {
		part := todo[0]
		todo = todo[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return false
			}
			cur = cur[:len(cur)-1]
			continue
		}
		next := append(cur[:len(cur):len(cur)], part)
		if link, ok := lookup(next); ok {
			if hops++; hops > 40 {
				return true
			}
			if path.IsAbs(link) {
				return false
			}
			todo = append(strings.Split(link, "/"), todo...)
			continue
		}
		cur = next
	}
	return true
}

// LinkStaysInside reports whether the symlink made at rel (below the destination),
// pointing at target, resolves inside the destination on this host. A destination that
// is itself a symlink never does: it is then a link to elsewhere.
func (l *Layout) LinkStaysInside(rel, target string) bool {
	if rel == "" {
		return false
	}
	parts := strings.Split(rel, "/")
	return StaysInside(parts[:len(parts)-1], target, func(p []string) (string, bool) {
		link, err := os.Readlink(filepath.Join(append([]string{l.Dst}, p...)...))
		return link, err == nil
	})
}

// Seeds are the archives every tar fuzz target starts from: each a script for
// Build, the attacks the extractors' own tests make and the shapes real copies
// have.
var Seeds = []string{
	Line(KindDir, "root/", "") + Line(KindReg, "root/a.txt", "hello") +
		Line(KindDir, "root/sub/", "") + Line(KindReg, "root/sub/b", "\x00\x00data"),
	Line(KindReg, "file", "a single file"),
	// Climbing out, by name and by a second root.
	Line(KindReg, "root/../escape", "x"),
	Line(KindReg, "/abs", "x"),
	Line(KindReg, "root/a", "x") + Line(KindReg, "other/b", "x"),
	Line(KindReg, "./root/./a//b", "x"),
	// A link out, then a write through it.
	Line(KindDir, "root", "") + Line(KindSymlink, "root/out", "../outside") +
		Line(KindReg, "root/out/victim", "overwritten"),
	Line(KindDir, "root", "") + Line(KindSymlink, "root/abs", OutsideToken) +
		Line(KindReg, "root/abs/victim", "overwritten") + Line(KindDir, "root/abs/dir", ""),
	Line(KindDir, "root", "") + Line(KindSymlink, "root/v", OutsideToken+"/victim") +
		Line(KindReg, "root/v", "replaced, not written through"),
	// The root itself a link.
	Line(KindSymlink, "root", "../outside") + Line(KindReg, "root/victim", "x"),
	// Links that stay inside, and ones that climb after a name.
	Line(KindDir, "root/a/b", "") + Line(KindSymlink, "root/a/b/up", "../../a") +
		Line(KindSymlink, "root/a/self", ".") + Line(KindSymlink, "root/a/trick", "self/../../..") +
		Line(KindReg, "root/a/b/up/f", "through an inside link"),
	// Hard links and special files.
	Line(KindDir, "root", "") + Line(KindHardlink, "root/h", OutsideToken+"/victim") +
		Line(KindHardlink, "root/h2", "../outside/victim") + Line(KindChar, "root/null", "") +
		Line(KindBlock, "root/loop", "") + Line(KindFifo, "root/fifo", "") +
		Line(KindSetuid, "root/suid", "#!/bin/sh\n"),
	// A directory where a file was, a file where a directory was.
	Line(KindReg, "root/x", "file") + Line(KindDir, "root/x", "") +
		Line(KindDir, "root/y", "") + Line(KindReg, "root/y", "file"),
	// Over a small cap.
	Line(KindReg, "root/big", strings.Repeat("z", 300)) + Line(KindReg, "root/more", "z"),
}

// RawSeeds are real tar streams, for the targets' raw mode: a PAX header, a GNU long
// name, a sparse file, as Go's writer makes them.
func RawSeeds() [][]byte {
	var out [][]byte
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "root/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "root/" + strings.Repeat("n", 150), Typeflag: tar.TypeReg, Mode: 0o644, Size: 3, Format: tar.FormatGNU})
	_, _ = tw.Write([]byte("abc"))
	_ = tw.WriteHeader(&tar.Header{Name: "root/pax", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1,
		PAXRecords: map[string]string{"SCHILY.xattr.user.x": "y", "path": "root/../../pax-escape"}, Format: tar.FormatPAX})
	_, _ = tw.Write([]byte("p"))
	_ = tw.Close()
	out = append(out, append([]byte(nil), buf.Bytes()...))
	// A GNU sparse file (old format), hand-made: the writer does not write them.
	var h [512]byte
	copy(h[0:], "root/sparse")
	copy(h[100:], "0000644\x00")
	copy(h[108:], "0000000\x00")
	copy(h[116:], "0000000\x00")
	copy(h[124:], "00000000004\x00") // stored bytes
	copy(h[136:], "00000000000\x00")
	h[156] = tar.TypeGNUSparse
	copy(h[257:], "ustar  \x00")
	copy(h[386:], "00000000000\x00") // offset 0
	copy(h[398:], "00000000004\x00") // 4 bytes
	copy(h[483:], "00000010000\x00") // real size 4096
	copy(h[148:], "        ")
	sum := 0
	for _, b := range h {
		sum += int(b)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	sparse := append(h[:], append([]byte("data"), make([]byte, 508+1024)...)...)
	out = append(out, sparse)
	return out
}
