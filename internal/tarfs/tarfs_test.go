//go:build unix

package tarfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRoundTripDirectory(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(src, "a", "b", "f.bin"), []byte{0, 1, 2, 255}, 0o600)
	os.WriteFile(filepath.Join(src, "empty"), nil, 0o644)
	os.Symlink("a/b/f.bin", filepath.Join(src, "link"))
	var buf bytes.Buffer
	wrep, err := Write(&buf, src, "root", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if wrep.Files != 2 || wrep.Dirs != 3 || wrep.Links != 1 || wrep.Bytes != 4 {
		t.Fatalf("write report %+v", wrep)
	}
	dst := filepath.Join(t.TempDir(), "out")
	rep, err := Extract(&buf, dst, Options{Links: InsideLinks})
	if err != nil {
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
	if rep.Files != 2 || rep.Links != 1 || rep.Skipped != 0 {
		t.Fatalf("extract report %+v", rep)
	}
}

// entry is an archive entry for archive(); Size defaults to len(Body).
type entry struct {
	tar.Header
	Body string
}

func archive(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(e.Body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.Body)
	}
	tw.Close()
	return &buf
}

func dirE(name string) entry {
	return entry{Header: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755}}
}
func fileE(name, body string) entry {
	return entry{Header: tar.Header{Name: name, Typeflag: tar.TypeReg}, Body: body}
}
func linkE(name, to string) entry {
	return entry{Header: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: to}}
}

// victim is a directory outside every destination, with a file whose content must not change.
func victim(t *testing.T) string {
	t.Helper()
	v := t.TempDir()
	if err := os.WriteFile(filepath.Join(v, "keep"), []byte("victim"), 0o600); err != nil {
		t.Fatal(err)
	}
	return v
}

func checkVictim(t *testing.T, v string) {
	t.Helper()
	entries, _ := os.ReadDir(v)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the victim directory changed: %v", names)
	}
	if b, _ := os.ReadFile(filepath.Join(v, "keep")); string(b) != "victim" {
		t.Fatalf("the victim file changed: %q", b)
	}
}

func TestExtractRefusesEscapes(t *testing.T) {
	v := victim(t)
	cases := map[string]*bytes.Buffer{
		"dotdot":      archive(t, fileE("../../evil", "x")),
		"inner":       archive(t, dirE("root/"), fileE("root/a/../../evil", "x")),
		"absolute":    archive(t, fileE(filepath.Join(v, "evil"), "x")),
		"second root": archive(t, dirE("root/"), fileE("other/evil", "x")),
	}
	for name, buf := range cases {
		t.Run(name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "out")
			_, err := Extract(buf, dst, Options{Links: AllLinks})
			if !errors.Is(err, ErrUnsafe) {
				t.Fatalf("Extract: %v, want ErrUnsafe", err)
			}
			checkVictim(t, v)
		})
	}
}

// TestExtractNeverWritesThroughLinks is the audit's two-step attack and its variants: a
// symlink, made by one archive or planted on the host, at or below the destination, and
// a later archive that writes a directory tree where it stands.
func TestExtractNeverWritesThroughLinks(t *testing.T) {
	for _, links := range []LinkPolicy{SkipLinks, InsideLinks, AllLinks} {
		v := victim(t)
		tmp := t.TempDir()
		dst := filepath.Join(tmp, "e")
		// Step one: the sandbox's /tmp/e is a symlink to the victim.
		rep, err := Extract(archive(t, linkE("e", v)), dst, Options{Links: links})
		if err != nil {
			t.Fatal(err)
		}
		if links != AllLinks {
			if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) || rep.Skipped != 1 {
				t.Fatalf("links %d: a symlink pointing out was made (%v), report %+v", links, err, rep)
			}
			// Plant it on the host instead, as another user might.
			os.Symlink(v, dst)
		}
		// Step two: /tmp/e is now a directory holding cron.d/p and a file at keep.
		_, err = Extract(archive(t, dirE("e/"), dirE("e/cron.d/"), fileE("e/cron.d/p", "pwned"), fileE("e/keep", "pwned")), dst, Options{Links: links})
		if err != nil {
			t.Fatalf("links %d: second copy: %v", links, err)
		}
		checkVictim(t, v)
		if fi, err := os.Lstat(dst); err != nil || !fi.IsDir() {
			t.Fatalf("links %d: the destination is not a directory now: %v", links, err)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "cron.d", "p")); string(b) != "pwned" {
			t.Fatalf("links %d: the content did not land in the destination", links)
		}
	}
}

func TestExtractReplacesPlantedLinksBelow(t *testing.T) {
	v := victim(t)
	dst := filepath.Join(t.TempDir(), "out")
	os.MkdirAll(dst, 0o755)
	os.Symlink(v, filepath.Join(dst, "sub"))                      // a directory link below
	os.Symlink(filepath.Join(v, "keep"), filepath.Join(dst, "f")) // a file link below
	_, err := Extract(archive(t, dirE("out/"), fileE("out/sub/keep", "pwned"), fileE("out/f", "pwned"), fileE("out/sub/new", "x")), dst, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkVictim(t, v)
	for _, p := range []string{"sub", "f"} {
		if fi, err := os.Lstat(filepath.Join(dst, p)); err != nil || fi.Mode()&os.ModeSymlink != 0 {
			t.Fatalf("%s is still a symlink (%v)", p, err)
		}
	}
	// The root itself, a file this time, as a planted symlink to the victim's file.
	dst2 := filepath.Join(t.TempDir(), "f")
	os.Symlink(filepath.Join(v, "keep"), dst2)
	if _, err := Extract(archive(t, fileE("f", "pwned")), dst2, Options{}); err != nil {
		t.Fatal(err)
	}
	checkVictim(t, v)
}

func TestInsideLinks(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "r")
	rep, err := Extract(archive(t,
		dirE("r/"), dirE("r/a/"), fileE("r/f", "x"),
		linkE("r/a/in", "../f"),        // inside
		linkE("r/dot", "."),            // the root itself: inside
		linkE("r/a/deep", "../a/in"),   // through another inside link
		linkE("r/out", "../x"),         // one level above the root
		linkE("r/abs", "/etc"),         // absolute
		linkE("r/a/tricky", "b/../.."), // ".." after a name
		linkE("r/via", "dot/.."),       // dot is the root: dot/.. is its parent
	), dst, Options{Links: InsideLinks})
	if err != nil {
		t.Fatal(err)
	}
	for _, kept := range []string{"a/in", "dot", "a/deep"} {
		if _, err := os.Readlink(filepath.Join(dst, kept)); err != nil {
			t.Errorf("%s was not kept: %v", kept, err)
		}
	}
	for _, skipped := range []string{"out", "abs", "a/tricky", "via"} {
		if _, err := os.Lstat(filepath.Join(dst, skipped)); err == nil {
			t.Errorf("%s was created", skipped)
		}
	}
	if rep.Skipped != 4 || rep.Links != 3 || len(rep.Examples) != 4 || rep.Examples[0].Reason != ReasonOutside {
		t.Fatalf("report %+v", rep)
	}
}

func TestSkippedByDefault(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "r")
	rep, err := Extract(archive(t, dirE("r/"), linkE("r/l", "x"),
		entry{Header: tar.Header{Name: "r/dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		entry{Header: tar.Header{Name: "r/hard", Typeflag: tar.TypeLink, Linkname: "r/l"}},
	), dst, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Skipped != 3 || rep.Examples[0].Reason != ReasonLink || rep.Examples[1].Reason != ReasonSpecial {
		t.Fatalf("report %+v", rep)
	}
	entries, _ := os.ReadDir(dst)
	if len(entries) != 0 {
		t.Fatalf("made %d entries", len(entries))
	}
	if _, err := Extract(archive(t, dirE("r/"), linkE("r/l", "x")), filepath.Join(t.TempDir(), "r"), Options{Links: RefuseLinks}); !errors.Is(err, ErrLinkRefused) {
		t.Fatalf("RefuseLinks: %v", err)
	}
}

// hugeArchive is a tar stream whose one file claims size bytes of zeros, produced only
// as it is read; read counts what was read.
func hugeArchive(name string, size int64, read *int64) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Size: size, Mode: 0o644})
		chunk := make([]byte, 1<<20)
		for off := int64(0); off < size; off += int64(len(chunk)) {
			n := min(int64(len(chunk)), size-off)
			if _, err := tw.Write(chunk[:n]); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.CloseWithError(tw.Close())
	}()
	return &countingReader{r: pr, n: read}
}

type countingReader struct {
	r io.ReadCloser
	n *int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += int64(n)
	return n, err
}

func TestLimitRefusedBeforeWriting(t *testing.T) {
	var read int64
	r := hugeArchive("s", 10<<40, &read)
	dst := filepath.Join(t.TempDir(), "s")
	_, err := Extract(r, dst, Options{MaxBytes: 1 << 30})
	r.(*countingReader).r.Close()
	var le *LimitError
	if !errors.As(err, &le) || !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "10 TiB") || !strings.Contains(err.Error(), "1 GiB") {
		t.Fatalf("Extract: %v, want a LimitError naming 10 TiB and 1 GiB", err)
	}
	if read > 1<<20 {
		t.Fatalf("read %d bytes before refusing", read)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the destination was created: %v", err)
	}
	// The cap counts every file of the copy together.
	_, err = Extract(archive(t, dirE("r/"), fileE("r/a", "12345"), fileE("r/b", "123456")), filepath.Join(t.TempDir(), "r"), Options{MaxBytes: 10})
	if !errors.As(err, &le) || le.Name != "r/b" {
		t.Fatalf("second file over the cap: %v", err)
	}
}

// TestFailedExtractTakesBackWhatItMade: a stream that breaks part way (a limit hit
// upstream, a dropped connection) leaves no half-written destination when the copy made
// it, and leaves one that was already there in place.
func TestFailedExtractTakesBackWhatItMade(t *testing.T) {
	whole := archive(t, dirE("d/"), fileE("d/a", "aaaa"), dirE("d/sub/"), fileE("d/sub/b", strings.Repeat("b", 8192)))
	b, _ := io.ReadAll(whole)
	cut := bytes.NewReader(b[:len(b)-4096]) // inside d/sub/b's content
	dst := filepath.Join(t.TempDir(), "d")
	if _, err := Extract(cut, dst, Options{}); err == nil {
		t.Fatal("a broken stream extracted without error")
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the half-written destination is still there: %v", err)
	}

	// A destination that was there stays, with what it had.
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dst, "mine"), []byte("kept"), 0o644)
	if _, err := Extract(bytes.NewReader(b[:len(b)-4096]), dst, Options{}); err == nil {
		t.Fatal("a broken stream extracted without error")
	}
	if got, err := os.ReadFile(filepath.Join(dst, "mine")); err != nil || string(got) != "kept" {
		t.Fatalf("a file that was there before: %q %v", got, err)
	}
}

func TestSparseKept(t *testing.T) {
	const size = 100 << 20
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		tw.WriteHeader(&tar.Header{Name: "sparse", Typeflag: tar.TypeReg, Size: size, Mode: 0o644})
		zero := make([]byte, 1<<20)
		for i := 0; i < 100; i++ {
			chunk := zero
			if i == 50 {
				chunk = bytes.Repeat([]byte("d"), 1<<20)
				chunk = append(bytes.Repeat([]byte{0}, 4096), chunk[:4096]...)
				chunk = append(chunk, make([]byte, 1<<20-8192)...)
			}
			tw.Write(chunk)
		}
		pw.CloseWithError(tw.Close())
	}()
	dst := filepath.Join(t.TempDir(), "sparse")
	if _, err := Extract(pr, dst, Options{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil || fi.Size() != size {
		t.Fatalf("size %v %v", fi, err)
	}
	blocks := fi.Sys().(*syscall.Stat_t).Blocks * 512
	if blocks > 1<<20 {
		t.Fatalf("the 100 MiB file with 4 KiB of data takes %d bytes of disk", blocks)
	}
	f, _ := os.Open(dst)
	defer f.Close()
	got := make([]byte, 4096)
	f.ReadAt(got, 50<<20+4096)
	if !bytes.Equal(got, bytes.Repeat([]byte("d"), 4096)) {
		t.Fatal("the data block was lost")
	}
	f.ReadAt(got, 50<<20)
	if !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("the hole does not read as zeros")
	}
}

func TestWriteSendsLinksAsLinks(t *testing.T) {
	v := victim(t)
	src := t.TempDir()
	os.Symlink(filepath.Join(v, "keep"), filepath.Join(src, "f"))
	os.Symlink(v, filepath.Join(src, "d"))
	var buf bytes.Buffer
	if _, err := Write(&buf, src, "r", Options{}); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(buf.Bytes(), []byte("victim")) {
		t.Fatal("the victim's content was read through a symlink")
	}
	// A symlink along a path given below an open directory is refused.
	dir, _ := os.Open(src)
	defer dir.Close()
	if _, err := WriteAt(io.Discard, dir, "d/keep", "x", Options{}); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("WriteAt through a symlink: %v", err)
	}
}

func TestWriteSkipsSpecialFiles(t *testing.T) {
	src := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var rep Report
	go func() {
		var err error
		rep, err = Write(io.Discard, src, "r", Options{})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil || rep.Skipped != 1 {
			t.Fatalf("Write: %v %+v", err, rep)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Write blocked on a fifo")
	}
}

func TestWriteLimit(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a"), make([]byte, 100), 0o644)
	_, err := Write(io.Discard, src, "r", Options{MaxBytes: 99})
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("Write: %v, want ErrLimit", err)
	}
}

// TestWriteRaceNeverReadsThroughALink swaps a file and a symlink to a victim file while
// the directory is written over and over: the victim's content must never be in a stream.
func TestWriteRaceNeverReadsThroughALink(t *testing.T) {
	v := victim(t)
	src := t.TempDir()
	p := filepath.Join(src, "f")
	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		tmpFile, tmpLink := filepath.Join(src, ".f"), filepath.Join(src, ".l")
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.WriteFile(tmpFile, []byte("plain"), 0o644)
			os.Rename(tmpFile, p)
			os.Symlink(filepath.Join(v, "keep"), tmpLink)
			os.Rename(tmpLink, p)
		}
	}()
	for i := 0; i < 2000; i++ {
		var buf bytes.Buffer
		Write(&buf, src, "r", Options{})
		if bytes.Contains(buf.Bytes(), []byte("victim")) {
			close(stop)
			<-swapped
			t.Fatalf("round %d: the victim's content was read", i)
		}
	}
	close(stop)
	<-swapped
}

func TestFilter(t *testing.T) {
	in := archive(t, dirE("./src/"), fileE("src/a", "1"), linkE("src/in", "a"), linkE("src/out", "/etc"),
		entry{Header: tar.Header{Name: "src/fifo", Typeflag: tar.TypeFifo}})
	var out bytes.Buffer
	rep, err := Filter(in, &out, "dst", Options{Links: InsideLinks})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Skipped != 2 || rep.Files != 1 || rep.Links != 1 {
		t.Fatalf("report %+v", rep)
	}
	tr := tar.NewReader(&out)
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, ",") != "dst/,dst/a,dst/in" {
		t.Fatalf("filtered entries %v", names)
	}
	var read int64
	huge := hugeArchive("s", 10<<40, &read)
	_, err = Filter(huge, io.Discard, "", Options{MaxBytes: 1 << 30})
	huge.(*countingReader).r.Close()
	if !errors.Is(err, ErrLimit) || read > 1<<20 {
		t.Fatalf("Filter of 10 TiB: %v after %d bytes", err, read)
	}
}
