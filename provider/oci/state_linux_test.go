package oci

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// stateTestBase is a directory of the test's own on the root filesystem (a disk's, not a
// tmpfs, on the machines the suite runs on; t.TempDir may be either).
func stateTestBase(t *testing.T) string {
	t.Helper()
	testenv.Needs(t, testenv.Root) // it mounts
	if err := os.MkdirAll("/var/lib/roche-test", 0o700); err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp("/var/lib/roche-test", "state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range mountsBelow(base) {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", m, err)
			}
		}
		os.RemoveAll(base)
	})
	var fs unix.Statfs_t
	if err := unix.Statfs(base, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Fatalf("%s is on a tmpfs: this test needs a disk's filesystem", base)
	}
	return base
}

func onTmpfs(t *testing.T, dir string) bool {
	t.Helper()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	return fs.Type == unix.TMPFS_MAGIC
}

// TestStateOnTmpfs: an empty state directory on a disk gets a tmpfs of its own, once,
// when two processes' providers start together; one holding a sandbox or a runtime's
// container state keeps its content visible where it is, and so does one that is a
// mount point already.
func TestStateOnTmpfs(t *testing.T) {
	base := stateTestBase(t)
	ctx := context.Background()

	t.Run("empty", func(t *testing.T) {
		dir := filepath.Join(base, "empty")
		if err := os.MkdirAll(filepath.Join(dir, "runtime", "crun"), 0o700); err != nil {
			t.Fatal(err)
		}
		// What a probe left is not state.
		if err := os.WriteFile(filepath.Join(dir, "probe-crun.json"), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		mounted := make([]bool, 4)
		for i := range mounted {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if mounted[i], err = stateOnTmpfs(ctx, dir); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		n := 0
		for _, m := range mounted {
			if m {
				n++
			}
		}
		if n != 1 || !onTmpfs(t, dir) {
			t.Fatalf("%d of 4 concurrent starts mounted, want 1; on a tmpfs: %v", n, onTmpfs(t, dir))
		}
		if got := mountsBelow(dir); len(got) != 1 {
			t.Errorf("mounts at the state directory: %q, want one", got)
		}
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil || st.Mode&0o777 != 0o700 {
			t.Errorf("the tmpfs's mode is %o (%v), want 700", st.Mode&0o777, err)
		}
	})

	for name, prepare := range map[string]func(dir string) error{
		"sandbox": func(dir string) error { return os.MkdirAll(filepath.Join(dir, Name+"-0123456789abcdef"), 0o700) },
		"runtime state": func(dir string) error {
			return os.MkdirAll(filepath.Join(dir, "runtime", "crun", Name+"-0123456789abcdef"), 0o700)
		},
		"mount point": func(dir string) error {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			return unix.Mount(dir, dir, "", unix.MS_BIND, "")
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(base, name)
			if err := prepare(dir); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadDir(dir)
			mounted, err := stateOnTmpfs(ctx, dir)
			if err != nil || mounted || onTmpfs(t, dir) {
				t.Fatalf("mounted %v (%v), on a tmpfs %v: want the directory left as it is", mounted, err, onTmpfs(t, dir))
			}
			if after, _ := os.ReadDir(dir); len(after) != len(before) {
				t.Errorf("%d entries visible after, %d before", len(after), len(before))
			}
		})
	}
}
