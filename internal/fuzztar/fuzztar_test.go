//go:build unix

package fuzztar

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestRawSeedsRead checks that the hand-made raw seeds are tar streams Go reads, so that
// the fuzz targets start from real archives rather than from bytes no reader accepts.
func TestRawSeedsRead(t *testing.T) {
	for i, raw := range RawSeeds() {
		tr := tar.NewReader(bytes.NewReader(raw))
		n := 0
		for {
			_, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("raw seed %d: entry %d: %v", i, n, err)
			}
			if _, err := io.Copy(io.Discard, tr); err != nil {
				t.Fatalf("raw seed %d: entry %d: %v", i, n, err)
			}
			n++
		}
		if n == 0 {
			t.Fatalf("raw seed %d holds no entry", i)
		}
	}
}

// TestStaysInside: the checker the targets trust says outside for links that climb out,
// directly or through other links, and inside for those that do not.
func TestStaysInside(t *testing.T) {
	links := map[string]string{"a/self": ".", "a/up": "..", "a/abs": "/etc", "a/loop": "loop"}
	lookup := func(p []string) (string, bool) {
		to, ok := links[joinSlash(p)]
		return to, ok
	}
	for _, c := range []struct {
		dir    string
		target string
		inside bool
	}{
		{"a", "b", true},
		{"a", "..", true},
		{"a", "../..", false},
		{"a", "self/../..", false}, // ".." after a link to "." climbs from a, not from a/self
		{"a", "up/..", false},
		{"a", "up/a/up/a", true},
		{"a", "abs", false},
		{"a", "loop", true},
		{"", "x/../..", false},
		{"a/b/c", "../../../d", true},
		{"a/b/c", "/d", false},
		{"a", "", false},
	} {
		var dir []string
		if c.dir != "" {
			dir = bytesSplit(c.dir)
		}
		if got := StaysInside(dir, c.target, lookup); got != c.inside {
			t.Errorf("a link in %q to %q: inside %v, want %v", c.dir, c.target, got, c.inside)
		}
	}
}

func joinSlash(p []string) string {
	var b bytes.Buffer
	for i, s := range p {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(s)
	}
	return b.String()
}

func bytesSplit(s string) []string {
	var out []string
	for _, p := range bytes.Split([]byte(s), []byte("/")) {
		out = append(out, string(p))
	}
	return out
}

// TestLayoutSeesEscapes: Check notices a victim written, a file made beside the
// destination and a hard link of a victim; Walk notices the hard link too.
func TestLayoutSeesEscapes(t *testing.T) {
	for name, escape := range map[string]func(l *Layout) error{
		"write":    func(l *Layout) error { return os.WriteFile(filepath.Join(l.Outside, "victim"), []byte("x"), 0o644) },
		"beside":   func(l *Layout) error { return os.WriteFile(filepath.Join(l.Base, "dst-sibling"), nil, 0o644) },
		"hardlink": func(l *Layout) error { return os.Link(filepath.Join(l.Outside, "victim"), filepath.Join(l.Dst, "h")) },
		"chmod":    func(l *Layout) error { return os.Chmod(filepath.Join(l.Outside, "dir"), 0o700) },
		"remove":   func(l *Layout) error { return os.Remove(filepath.Join(l.Outside, "link")) },
	} {
		ft := &fakeT{TB: t}
		l := NewLayout(t, true)
		if err := escape(l); err != nil {
			t.Fatal(err)
		}
		l.Check(ft)
		l.Walk(ft)
		if ft.errors == 0 {
			t.Errorf("%s: the layout saw nothing", name)
		}
	}
}

type fakeT struct {
	testing.TB
	errors int
}

func (f *fakeT) Errorf(string, ...any) { f.errors++ }
func (f *fakeT) Helper()               {}
