package doccheck

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the checkout this package is in.
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// markdownFiles are the checkout's Markdown files, relative to root: all of them but
// those under node_modules, hidden directories and build output (bin, dist).
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			name := d.Name()
			if p != root && (strings.HasPrefix(name, ".") || name == "node_modules" ||
				rel == "bin" || rel == "dist") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".md") {
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no Markdown files under %s", root)
	}
	return out
}

// checker checks links and paths against the files under root, parsing each Markdown
// file once.
type checker struct {
	root string
	docs map[string]Doc
	// tops are the top-level directories a path in code may start with.
	tops map[string]bool
}

func newChecker(t *testing.T, root string, files []string) *checker {
	t.Helper()
	c := &checker{root: root, docs: map[string]Doc{}, tops: map[string]bool{}}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		c.docs[f] = Parse(string(b))
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		// testdata, by Go's convention, is a package's own (the package's
		// testdata/fuzz/...), so a path starting with it is not the repository's.
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !slices.Contains([]string{"testdata", "bin", "dist", "node_modules"}, e.Name()) {
			c.tops[e.Name()] = true
		}
	}
	return c
}

// link returns what is wrong with a relative link in file, or "".
func (c *checker) link(file, target string) string {
	p, frag := SplitTarget(target)
	dest := file
	if p != "" {
		if strings.HasPrefix(p, "/") {
			dest = strings.TrimPrefix(p, "/")
		} else {
			dest = filepath.ToSlash(filepath.Join(filepath.Dir(file), p))
		}
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return fmt.Sprintf("%s leads out of the repository", target)
		}
		if _, err := os.Stat(filepath.Join(c.root, dest)); err != nil {
			return fmt.Sprintf("%s: no such file or directory %s (fix the link, or the path it was moved to)", target, dest)
		}
	}
	if frag == "" {
		return ""
	}
	d, ok := c.docs[dest]
	if !ok {
		return "" // a fragment of a source file (a line) or a directory: not a heading
	}
	if !d.Anchors[frag] {
		return fmt.Sprintf("%s: no heading in %s makes the anchor #%s (%s)", target, dest, frag, nearest(d, frag))
	}
	return ""
}

// nearest suggests the anchors of d that share a word with frag.
func nearest(d Doc, frag string) string {
	var like []string
	for a := range d.Anchors {
		for _, w := range strings.Split(frag, "-") {
			if len(w) > 3 && strings.Contains(a, w) {
				like = append(like, "#"+a)
				break
			}
		}
	}
	slices.Sort(like)
	if len(like) == 0 {
		return "its headings changed: link to one that exists"
	}
	if len(like) > 5 {
		like = like[:5]
	}
	return "did you mean " + strings.Join(like, ", ") + "?"
}

// placeholder is a path component that stands for any name (NAME, ID, FILE).
var placeholder = regexp.MustCompile(`^[A-Z][A-Z0-9_]+$`)

// path returns what is wrong with a repository path written in file's code, or "" (also
// for what is not a repository path: one not starting with a top-level directory, or
// with a placeholder in it).
func (c *checker) path(file, code string) string {
	p := strings.TrimPrefix(code, "./")
	p = strings.TrimSuffix(strings.TrimSuffix(p, "/..."), "/")
	parts := strings.Split(p, "/")
	if !c.tops[parts[0]] {
		return ""
	}
	for _, part := range parts {
		if placeholder.MatchString(part) {
			return ""
		}
	}
	for _, base := range []string{"", filepath.Dir(file)} {
		if _, err := os.Stat(filepath.Join(c.root, base, p)); err == nil {
			return ""
		}
	}
	return fmt.Sprintf("`%s`: no such file or directory in the repository (fix the path, or write it out of code if it is not one)", code)
}

// TestDocs checks every Markdown file of the checkout: relative links lead to files that
// exist, anchors to headings that make them (GitHub's rules), and repository paths in
// code name something that exists. Links to other sites are listed, not fetched (no
// network in tests).
func TestDocs(t *testing.T) {
	r := root(t)
	files := markdownFiles(t, r)
	c := newChecker(t, r, files)
	var external []string
	var checked int
	for _, f := range files {
		d := c.docs[f]
		for _, l := range d.Links {
			switch {
			case External(l.Target):
				external = append(external, fmt.Sprintf("%s:%d: %s", f, l.Line, l.Target))
			case Scheme(l.Target):
			default:
				checked++
				if why := c.link(f, l.Target); why != "" {
					t.Errorf("%s:%d: link to %s", f, l.Line, why)
				}
			}
		}
		for _, p := range d.Paths {
			checked++
			if why := c.path(f, p.Target); why != "" {
				t.Errorf("%s:%d: %s", f, p.Line, why)
			}
		}
	}
	t.Logf("%d Markdown files, %d links and paths checked", len(files), checked)
	t.Logf("%d links to other sites, not fetched:\n%s", len(external), strings.Join(external, "\n"))
}

// TestReadmeShort keeps the README a front page: at most about 300 lines, with the
// command line's quick start on its first screen. The rest belongs in docs/.
func TestReadmeShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > 320 {
		t.Errorf("README.md has %d lines, over ~300: move what is not the front page (what Roche is, the quick start, install, providers, links) into docs/", len(lines))
	}
	first := slices.Index(lines, "<!-- quickstart: cli -->")
	if first < 0 || first > 30 {
		t.Errorf("the command line's quick start (<!-- quickstart: cli -->) is on line %d of README.md, want it within the first 30 lines", first+1)
	}
}
