package ledger

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestReplaceFileReusesItsSpare: each write leaves exactly the new content at the path,
// shorter after longer included, and the previous content in the spare beside it; from
// the second write on, the file and the spare trade inodes instead of new files being
// made (what made the state's writes costly on ext4); a symbolic link planted as the
// spare is not followed.
func TestReplaceFileReusesItsSpare(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	spare := filepath.Join(dir, ".state.json.spare")
	inode := func(p string) uint64 {
		t.Helper()
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	contents := []string{"first, the longest of them", "second", "third, longer again", "4"}
	var inodes []uint64
	for i, c := range contents {
		if err := replaceFile(path, []byte(c)); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != c {
			t.Fatalf("write %d: the file holds %q (%v), want %q", i, b, err, c)
		}
		if i > 0 {
			if b, err := os.ReadFile(spare); err != nil || string(b) != contents[i-1] {
				t.Fatalf("write %d: the spare holds %q (%v), want the previous %q", i, b, err, contents[i-1])
			}
		}
		inodes = append(inodes, inode(path))
	}
	// Writes 2 and 4 put back the inodes of 0 and 1 (its spare after 1 was 0's).
	if inodes[2] != inodes[0] || inodes[3] != inodes[1] || inodes[0] == inodes[1] {
		t.Errorf("inodes of the file after each write %v: want two, alternating from the second write", inodes)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("%d files in the state directory, want the file and its spare", len(entries))
	}

	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(spare); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, spare); err != nil {
		t.Fatal(err)
	}
	if err := replaceFile(path, []byte("after the link")); err == nil {
		t.Error("a write through a symbolic link planted as the spare succeeded")
	}
	if b, _ := os.ReadFile(victim); string(b) != "untouched" {
		t.Errorf("the link's target now holds %q", b)
	}
	if b, _ := os.ReadFile(path); string(b) != "4" {
		t.Errorf("after the refused write the file holds %q, want the last state", b)
	}
}
