//go:build unix

package tarfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// treeArchive is archive() with owners this process may give (ExtractTree keeps them).
func treeArchive(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	for i := range entries {
		entries[i].Uid, entries[i].Gid = os.Getuid(), os.Getgid()
		if entries[i].ModTime.IsZero() {
			entries[i].ModTime = time.Unix(1700000000, 0)
		}
	}
	return archive(t, entries...)
}

func hardE(name, to string) entry {
	return entry{Header: tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: to}}
}

// TestExtractTreeRefusesWritingThroughItsLinks: the image unpack of the oci provider
// (os.Root before it shared this path) let a later entry write through a symlink an
// earlier one made, as long as it resolved inside the tree: "/lib -> /" then
// "/lib/etc/passwd" wrote the tree's /etc/passwd. Such an archive is refused now, in a
// copy as in a tree, whether the link points inside, at the root or out; nothing is
// written through it, and the victim outside stays as it was.
func TestExtractTreeRefusesWritingThroughItsLinks(t *testing.T) {
	v := victim(t)
	for name, entries := range map[string][]entry{
		"link to the root":             {linkE("lib", "/"), fileE("lib/etc/passwd", "root::0:0::/:/bin/sh")},
		"link inside":                  {dirE("etc/"), linkE("e", "etc"), fileE("e/passwd", "root::0:0::/:/bin/sh")},
		"relative link out":            {linkE("up", "../../../../../../../.."+v), fileE("up/keep", "pwned")},
		"absolute link out":            {linkE("abs", v), dirE("abs/cron.d/"), fileE("abs/keep", "pwned")},
		"link, then a directory below": {dirE("a/"), linkE("a/l", "."), dirE("a/l/deeper/")},
	} {
		t.Run(name, func(t *testing.T) {
			dst := t.TempDir()
			_, err := ExtractTree(treeArchive(t, entries...), dst, TreeOptions{})
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("ExtractTree: %v, want ErrUnsafe", err)
			}
			checkVictim(t, v)
			for _, through := range []string{"etc/passwd", "a/deeper"} {
				if _, err := os.Lstat(filepath.Join(dst, through)); err == nil {
					t.Errorf("%s was written through the link", through)
				}
			}
		})
	}
	// A copy refuses the same stream, and takes back what it made.
	dst := filepath.Join(t.TempDir(), "r")
	_, err := Extract(archive(t, dirE("r/"), dirE("r/etc/"), linkE("r/e", "etc"), fileE("r/e/passwd", "x")), dst, Options{Links: AllLinks})
	if !errors.Is(err, ErrUnsafe) {
		t.Fatalf("Extract: %v, want ErrUnsafe", err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused copy left its destination: %v", err)
	}
}

// TestExtractTreeRefusesClimbing: a name with ".." anywhere is an error, where the oci
// provider's unpack used to skip it without a word; an absolute name lands inside.
func TestExtractTreeRefusesClimbing(t *testing.T) {
	v := victim(t)
	for _, name := range []string{"../keep", "a/../../keep", "a/b/../../../keep", "./../keep"} {
		dst := t.TempDir()
		_, err := ExtractTree(treeArchive(t, fileE(name, "pwned")), dst, TreeOptions{})
		if !errors.Is(err, ErrUnsafe) {
			t.Errorf("%q: %v, want ErrUnsafe", name, err)
		}
		checkVictim(t, v)
	}
	dst := t.TempDir()
	if _, err := ExtractTree(treeArchive(t, fileE(filepath.Join(v, "keep"), "inside")), dst, TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	checkVictim(t, v)
	if b, err := os.ReadFile(filepath.Join(dst, v, "keep")); err != nil || string(b) != "inside" {
		t.Fatalf("the absolute name did not land inside: %q %v", b, err)
	}
}

// TestExtractTreeHardLinks: a hard link joins two names of the tree and nothing else:
// not a file outside by its absolute name or by climbing, not a file reached through a
// symlink the archive made (inside or out), and not a directory.
func TestExtractTreeHardLinks(t *testing.T) {
	v := victim(t)
	dst := t.TempDir()
	rep, err := ExtractTree(treeArchive(t, dirE("usr/bin/"), fileE("usr/bin/python3", "ELF"),
		hardE("usr/bin/python", "usr/bin/python3"), hardE("py", "/usr/bin/python3")), dst, TreeOptions{})
	if err != nil || rep.HardLinks != 2 || rep.Files != 1 {
		t.Fatalf("ExtractTree: %v, report %+v", err, rep)
	}
	a, _ := os.Stat(filepath.Join(dst, "usr/bin/python3"))
	for _, l := range []string{"usr/bin/python", "py"} {
		if b, err := os.Stat(filepath.Join(dst, l)); err != nil || !os.SameFile(a, b) {
			t.Errorf("%s is not a hard link of usr/bin/python3: %v", l, err)
		}
	}
	for name, entries := range map[string][]entry{
		"absolute name of a victim": {hardE("h", filepath.Join(v, "keep"))},
		"climbing to a victim":      {hardE("h", "../../../../../../.."+filepath.Join(v, "keep"))},
		"through a link out":        {linkE("l", v), hardE("h", "l/keep")},
		"through a link inside":     {dirE("usr/bin/"), fileE("usr/bin/python3", "ELF"), linkE("bin", "usr/bin"), hardE("h", "bin/python3")},
		"a directory":               {dirE("d/"), hardE("h", "d")},
	} {
		_, err := ExtractTree(treeArchive(t, entries...), t.TempDir(), TreeOptions{})
		if err == nil {
			t.Errorf("%s: extracted without error", name)
		}
		checkVictim(t, v)
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(v, "keep"), &st) == nil && st.Nlink != 1 {
			t.Fatalf("%s: the victim has %d links", name, st.Nlink)
		}
	}
}

// TestExtractTreeReplacesPlantedLinks: a symlink already in the destination, planted
// before the unpack by whoever could, is replaced by what the archive has there, never
// followed (the microVM root filesystem builder used to fail on it, the oci unpack to
// follow it if it stayed inside).
func TestExtractTreeReplacesPlantedLinks(t *testing.T) {
	v := victim(t)
	dst := t.TempDir()
	os.Symlink(v, filepath.Join(dst, "etc"))
	os.Symlink(filepath.Join(v, "keep"), filepath.Join(dst, "keep"))
	os.Mkdir(filepath.Join(dst, "inner"), 0o755)
	os.Symlink("../etc", filepath.Join(dst, "inner", "up"))
	_, err := ExtractTree(treeArchive(t, fileE("etc/passwd", "x"), fileE("keep", "pwned"), fileE("inner/up/f", "x"), dirE("etc/")), dst, TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkVictim(t, v)
	for _, p := range []string{"etc", "keep", "inner/up"} {
		if fi, err := os.Lstat(filepath.Join(dst, p)); err != nil || fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("%s is still a symlink (%v)", p, err)
		}
	}
}

// TestExtractTreeKeepsModesAndSkipsDevices: owners, modes with their set-id bits and
// times as the archive says, directories' last (a read-only one still gets its
// entries); devices and fifos only when asked.
func TestExtractTreeKeepsModesAndSkipsDevices(t *testing.T) {
	dst := t.TempDir()
	mtime := time.Unix(1600000000, 0)
	suid := fileE("ro/suid", "#!/bin/sh\n")
	suid.Mode, suid.ModTime = 0o4755, mtime
	ro := dirE("ro/")
	ro.Mode, ro.ModTime = 0o555, mtime
	rep, err := ExtractTree(treeArchive(t, ro, suid,
		entry{Header: tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}},
		entry{Header: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o644}},
	), dst, TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(filepath.Join(dst, "ro"), 0o755)
	if rep.Skipped != 2 || rep.Nodes != 0 {
		t.Errorf("report %+v, want the device and the fifo skipped", rep)
	}
	for _, p := range []string{"dev/null", "fifo"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); err == nil {
			t.Errorf("%s was made without TreeOptions.Devices", p)
		}
	}
	for p, want := range map[string]os.FileMode{"ro": os.ModeDir | 0o555, "ro/suid": os.ModeSetuid | 0o755} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil || fi.Mode() != want || !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: %v %v, want %v at %v", p, fi.Mode(), err, want, mtime)
		}
	}
}

// TestExtractRaceNeverWritesThroughALink: while a tree and a copy are written into a
// directory, another process keeps swapping the directory their entries go to for a
// symlink to a victim (what a sandbox with a writable mount of the destination could
// do). Whatever the race makes of the extraction, nothing lands in the victim.
func TestExtractRaceNeverWritesThroughALink(t *testing.T) {
	const files = 300
	var entries []entry
	entries = append(entries, dirE("r/"), dirE("r/sub/"))
	for i := range files {
		entries = append(entries, fileE(fmt.Sprintf("r/sub/f%d", i), "pwned"))
	}
	for _, tree := range []bool{false, true} {
		v := victim(t)
		base := t.TempDir()
		dst := filepath.Join(base, "r")
		os.MkdirAll(filepath.Join(dst, "sub"), 0o755)
		stop := make(chan struct{})
		swapped := make(chan int)
		go func() {
			n := 0
			defer func() { swapped <- n }()
			sub, aside, link := filepath.Join(dst, "sub"), filepath.Join(dst, "aside"), filepath.Join(dst, ".l")
			for {
				select {
				case <-stop:
					return
				default:
				}
				os.RemoveAll(aside)
				if os.Rename(sub, aside) != nil {
					continue
				}
				os.Symlink(v, link)
				if os.Rename(link, sub) == nil {
					n++
				}
			}
		}()
		var err error
		for round := 0; round < 20; round++ {
			if tree {
				_, err = ExtractTree(treeArchive(t, entries...), base, TreeOptions{})
			} else {
				_, err = Extract(archive(t, entries...), dst, Options{})
			}
		}
		close(stop)
		n := <-swapped
		checkVictim(t, v)
		if n == 0 {
			t.Fatalf("tree %v: the race never planted a link (last extraction: %v)", tree, err)
		}
		t.Logf("tree %v: %d links planted; the last extraction: %v", tree, n, err)
	}
}

// TestExtractTreeLaterEntryReplaces: in a tree a later entry takes the place of an
// earlier one of another type, as tar does (a file where an empty directory was, a
// directory where a file was), while a directory that holds something stays and is an
// error; the walk goes on in the directories it had open.
func TestExtractTreeLaterEntryReplaces(t *testing.T) {
	dst := t.TempDir()
	_, err := ExtractTree(treeArchive(t, dirE("a/"), dirE("a/y/"), fileE("a/x", "file"),
		fileE("a/y", "now a file"), dirE("a/x/"), fileE("a/x/inner", "below"), fileE("a/z", "beside")), dst, TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"a/y": "now a file", "a/x/inner": "below", "a/z": "beside"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", p, b, err, want)
		}
	}
	_, err = ExtractTree(treeArchive(t, dirE("b/"), fileE("b/kept", "x"), fileE("b", "a file over a directory that holds one")), t.TempDir(), TreeOptions{})
	if !errors.Is(err, ErrIsDir) {
		t.Fatalf("a file over a directory with entries: %v, want ErrIsDir", err)
	}
}
