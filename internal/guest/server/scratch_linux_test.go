package server

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestCheckScratch: what the agent of a gVisor Pod refuses to start with (--scratch-max):
// a scratch mount that is not tmpfs (gVisor's gofer mount of the node's emptyDir, where
// its mount hints were not applied), or a tmpfs larger than asked (gVisor's own /dev/shm);
// a tmpfs of the size asked for passes. On real mounts, made here.
func TestCheckScratch(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	small, large, disk := t.TempDir(), t.TempDir(), t.TempDir()
	for dir, size := range map[string]string{small: "size=4m", large: "size=8m"} {
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, size); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	}
	if err := checkScratch(4<<20, small); err != nil {
		t.Errorf("a tmpfs of 4 MiB held to 4 MiB: %v", err)
	}
	for _, c := range []struct {
		name, dir, want string
	}{
		{"a tmpfs of 8 MiB", large, "a tmpfs of 8388608"},
		{"a directory on the host's disk", disk, "not tmpfs"},
	} {
		err := checkScratch(4<<20, small, c.dir)
		if err == nil || !strings.Contains(err.Error(), c.dir) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "pod_annotations") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s held to 4 MiB: %v, want one line refusing it (%s) and saying what to do", c.name, err, c.want)
		}
	}
}
