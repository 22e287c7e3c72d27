package server

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

func owner(t *testing.T, p string) (int, int) {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return int(st.Uid), int(st.Gid)
}

// TestChownTree: what belongs to the old uid changes hands, group too where it was the
// old uid's own; other owners' files, a symlink's target outside the tree and anything
// below a mount point are left alone (the attack: a snapshot's sandbox planted a link to
// a victim, or a host directory is bound in).
func TestChownTree(t *testing.T) {
	testenv.Needs(t, testenv.Root) // it changes the owners of files it makes
	const from, to = 1900000001, 1900000002
	root, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	mk := func(p string, uid, gid int, dir bool) {
		t.Helper()
		var err error
		if dir {
			err = os.Mkdir(p, 0o700)
		} else {
			err = os.WriteFile(p, []byte("x"), 0o600)
		}
		if err == nil {
			err = os.Lchown(p, uid, gid)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	mk(victim, from, from, false)
	mk(filepath.Join(root, "d"), from, from, true)
	mk(filepath.Join(root, "d", "f"), from, 50, false)
	mk(filepath.Join(root, "roots"), 0, 0, false)
	mk(filepath.Join(root, "mnt"), from, from, true)
	mk(filepath.Join(root, "mnt", "host"), from, from, false)
	link := filepath.Join(root, "d", "link")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, from, from); err != nil {
		t.Fatal(err)
	}
	mounts := map[string]bool{filepath.Join(root, "mnt"): true}
	if err := chownTree(root, mounts, from, to, to); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path     string
		uid, gid int
	}{
		{filepath.Join(root, "d"), to, to},
		{filepath.Join(root, "d", "f"), to, 50},
		{link, to, to},
		{filepath.Join(root, "roots"), 0, 0},
		{victim, from, from},
		{filepath.Join(root, "mnt"), from, from},
		{filepath.Join(root, "mnt", "host"), from, from},
	} {
		if uid, gid := owner(t, c.path); uid != c.uid || gid != c.gid {
			t.Errorf("%s: %d:%d, want %d:%d", c.path, uid, gid, c.uid, c.gid)
		}
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		"/":                 "/",
		`/mnt/a\040b`:       "/mnt/a b",
		`/x\134y`:           `/x\y`,
		`/tab\011and\012nl`: "/tab\tand\nnl",
		`/short\04`:         `/short\04`,
		`/not\999octal`:     `/not\999octal`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMountPointsHasRoot(t *testing.T) {
	m, err := mountPoints()
	if err != nil {
		t.Fatal(err)
	}
	if !m["/"] || !m["/proc"] {
		t.Fatalf("mount points %v lack / or /proc", m)
	}
}
