package oci

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestMountsBelow finds, in one read of the mount table, the mounts at and below each
// directory asked for, nested ones before what they sit on, names with a space included
// (mountinfo escapes it), and not a sibling whose name only begins like one of them.
func TestMountsBelow(t *testing.T) {
	testenv.Needs(t, testenv.Root) // it mounts
	base := t.TempDir()
	a, nested, spaced, sibling := filepath.Join(base, "a"), filepath.Join(base, "a", "in"), filepath.Join(base, "b c"), filepath.Join(base, "a2")
	var mounted []string
	t.Cleanup(func() {
		slices.Reverse(mounted)
		for _, m := range mounted {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", m, err)
			}
		}
	})
	for _, d := range []string{a, nested, spaced, sibling} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		mounted = append(mounted, d)
	}
	got := mountsBelow(a, spaced, filepath.Join(base, "none"))
	want := []string{spaced, nested, a}
	if !slices.Equal(got, want) {
		t.Errorf("mountsBelow = %q, want %q", got, want)
	}
	if got := mountsBelow(filepath.Join(base, "none")); len(got) != 0 {
		t.Errorf("mounts below a directory without any: %q", got)
	}
}
