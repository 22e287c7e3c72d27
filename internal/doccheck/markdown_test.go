package doccheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSlug(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		// Anchors the docs link to, as GitHub makes them.
		{"gVisor for Docker: `--runtime runsc`", "gvisor-for-docker---runtime-runsc"},
		{"Python SDK: `roche_sandbox`", "python-sdk-roche_sandbox"},
		{"The daemon's API, tenants and owners", "the-daemons-api-tenants-and-owners"},
		{"Copying files across the host boundary: `roche cp`", "copying-files-across-the-host-boundary-roche-cp"},
		{"The fast create path (issue 16), on the 2-core development machine", "the-fast-create-path-issue-16-on-the-2-core-development-machine"},
		{"Egress allowlist: `--allow-host`", "egress-allowlist---allow-host"},
		{"Kubernetes at scale: `bench/k8sscale`", "kubernetes-at-scale-benchk8sscale"},
		{"*Emphasis*, _under_ and a [link](x.md)", "emphasis-under-and-a-link"},
		{"Ünïcode — and ×", "ünïcode--and-"},
	} {
		if got := Slug(c.heading); got != c.want {
			t.Errorf("Slug(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
}

func TestParse(t *testing.T) {
	d := Parse(strings.Join([]string{
		"# Title",
		"## Same",
		"## Same",
		"Setext heading",
		"--------------",
		`<a name="here"></a>`,
		"A [link](other.md#same) and ![img](img/x.png \"title\"), `not [a](link.md)`, <https://example.org/a>.",
		"A bare https://example.com/b, a [nested](a_(b).md) one, and [spaced](<with space.md>).",
		"[def]: defs.md",
		"Code: `internal/guest/server`, `go test ./escape/ -run X`, `not a path`, `a/b c`.",
		"```sh",
		"# not a heading [nor](a-link.md)",
		"go run ./bench/exec",
		"```",
		"  ~~~~",
		"  ## indented fence, still code",
		"  ~~~~",
		"## After `code` #",
	}, "\n"))
	var anchors []string
	for a := range d.Anchors {
		anchors = append(anchors, a)
	}
	slices.Sort(anchors)
	if want := []string{"after-code", "here", "same", "same-1", "setext-heading", "title"}; !slices.Equal(anchors, want) {
		t.Errorf("anchors %q, want %q", anchors, want)
	}
	var links []string
	for _, l := range d.Links {
		links = append(links, l.Target)
	}
	if want := []string{"other.md#same", "img/x.png", "https://example.org/a", "a_(b).md", "with space.md", "https://example.com/b", "defs.md"}; !equalSets(links, want) {
		t.Errorf("links %q, want %q", links, want)
	}
	var paths []string
	for _, p := range d.Paths {
		paths = append(paths, p.Target)
	}
	if want := []string{"internal/guest/server", "./escape/", "./bench/exec"}; !slices.Equal(paths, want) {
		t.Errorf("paths %q, want %q", paths, want)
	}
}

func equalSets(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestCheckerCatches runs the checks on a small tree with one of each mistake, and on
// the same links made right: each mistake is reported, nothing else is.
func TestCheckerCatches(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Top\n\n## Quick start\n")
	write("docs/guide.md", "# Guide\n\n## Part one\n")
	write("internal/guest/server/doc.go", "package server\n")
	write("testdata/x", "")
	files := []string{"README.md", "docs/guide.md"}
	c := newChecker(t, root, files)

	for _, ok := range []string{"../README.md", "../README.md#quick-start", "#part-one", "guide.md#part-one", "/README.md", "../internal/guest/server/doc.go#L1", "../internal"} {
		if why := c.link("docs/guide.md", ok); why != "" {
			t.Errorf("link %s refused: %s", ok, why)
		}
	}
	for _, bad := range []string{"../READM.md", "../README.md#quick-starts", "#part-two", "../../outside.md"} {
		if why := c.link("docs/guide.md", bad); why == "" {
			t.Errorf("link %s passed", bad)
		}
	}
	for _, ok := range []string{"internal/guest/server", "./internal/guest/...", "internal/guest/NAME/x", "elsewhere/not/ours", "testdata/fuzz/FuzzXxx/"} {
		if why := c.path("docs/guide.md", ok); why != "" {
			t.Errorf("path %s refused: %s", ok, why)
		}
	}
	for _, bad := range []string{"internal/guest/srv", "./internal/seccompgen/", "internal/agent/..."} {
		if why := c.path("docs/guide.md", bad); why == "" {
			t.Errorf("path %s passed", bad)
		}
	}
}
