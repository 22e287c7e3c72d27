package imagebuild

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestMirrorFrom: the host's own mirror, from a deb822 source or a one-line one, so
// that an air-gapped host builds from what its apt uses.
func TestMirrorFrom(t *testing.T) {
	dir := t.TempDir()
	deb822 := filepath.Join(dir, "debian.sources")
	list := filepath.Join(dir, "sources.list")
	os.WriteFile(deb822, []byte("Types: deb\n# comment\nURIs: http://mirror.internal/debian http://other\nSuites: bookworm\n"), 0o644)
	os.WriteFile(list, []byte("# deb http://commented\ndeb [arch=amd64] http://bracketed bookworm main\ndeb http://list.internal/debian bookworm main\n"), 0o644)
	if got := mirrorFrom(deb822, list); got != "http://mirror.internal/debian" {
		t.Errorf("deb822: %q", got)
	}
	if got := mirrorFrom(filepath.Join(dir, "none"), list); got != "http://list.internal/debian" {
		t.Errorf("one-line: %q", got)
	}
	if got := mirrorFrom(filepath.Join(dir, "none"), filepath.Join(dir, "none")); got != "" {
		t.Errorf("no sources: %q, want debootstrap's default", got)
	}
}

// TestMountsBelow: what removeRoot unmounts before it removes a build's root (a failed
// debootstrap may leave /proc mounted in it): the mounts at or below a directory.
func TestMountsBelow(t *testing.T) {
	if got, err := mountsBelow(t.TempDir()); err != nil || len(got) != 0 {
		t.Errorf("a fresh directory: %v %v, want no mounts", got, err)
	}
	got, err := mountsBelow("/proc")
	if err != nil || !slices.Contains(got, "/proc") {
		t.Errorf("/proc: %v %v, want it listed", got, err)
	}
}
