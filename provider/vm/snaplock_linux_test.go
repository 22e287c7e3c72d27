package vm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSweepSnaps: List removes the snapshot directories of a process that ended (no lock
// on them) once they are a minute old, and leaves those held (by this process or
// another: flock is per open file), those younger and the VMs' own memory directories.
func TestSweepSnaps(t *testing.T) {
	p, err := NewQEMU(WithStateDir(t.TempDir()), WithMemoryDir(t.TempDir()), WithRAMDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	old := time.Now().Add(-2 * staleSnap)
	dirs := map[string]bool{ // name -> kept
		"snap-0000000000000001": false, // its maker ended: nobody holds it
		"snap-0000000000000002": true,  // held here
		"snap-0000000000000003": true,  // made just now, not held yet
		"qemu-000000000001":     true,  // a VM paused to disk: not a snapshot's
	}
	for name := range dirs {
		if err := p.makeMemDir(name); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p.memDir(name), "state"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if name != "snap-0000000000000003" {
			if err := os.Chtimes(p.memDir(name), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.lockSnap("snap-0000000000000002"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	for name, kept := range dirs {
		_, err := os.Stat(p.memDir(name))
		if kept && err != nil {
			t.Errorf("%s was removed: %v", name, err)
		}
		if !kept && err == nil {
			t.Errorf("%s, held by nobody, is still there", name)
		}
	}
	// Let go of, it goes at the next List.
	p.unlockSnap("snap-0000000000000002")
	if _, err := p.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.memDir("snap-0000000000000002")); err == nil {
		t.Error("snap-0000000000000002, let go of, is still there after List")
	}
}
