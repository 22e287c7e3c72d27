package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/flock"
	"github.com/roche-sandbox/roche/provider/internal/statedir"
)

// stateTmpfs is how the state directory's own tmpfs is mounted: the directory's mode,
// and a bound well above what its small files take (a sandbox's are a few kilobytes).
const stateTmpfs = "mode=0700,size=256m"

// stateOnTmpfs mounts a tmpfs at the state directory dir when dir is on another
// filesystem and holds no sandbox, and reports whether it did. The state directory is
// what dies with the host (each sandbox's bundle, record and agent socket, the runtime's
// state), which /run, a tmpfs on most hosts, is for; where /run is a disk's (as on
// hosts without systemd), every sandbox made and removed ~20 files on that disk. On an
// ext4 without a journal that gets slower the more was deleted in the last minutes (the
// inode allocator steps over each inode freed then), and what survived a reboot looked
// like sandboxes to reconcile. A directory already on a tmpfs (or ramfs), or that is a
// mount point of anything else (an operator's choice), is left as it is; so is one that
// holds sandboxes or runtime state, which the tmpfs would hide (it is mounted on a later
// start, once they are gone). The tmpfs stays mounted, like /run's content, until the
// host restarts. Processes sharing the directory (roche and roched) decide in turn,
// under a lock on its parent.
func stateOnTmpfs(ctx context.Context, dir string) (bool, error) {
	unlock, err := flock.Lock(ctx, filepath.Dir(dir))
	if err != nil {
		return false, fmt.Errorf("locking %s: %w", filepath.Dir(dir), err)
	}
	defer unlock()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return false, err
	}
	if fs.Type == unix.TMPFS_MAGIC || fs.Type == unix.RAMFS_MAGIC {
		return false, nil
	}
	if slices.Contains(mountsBelow(dir), dir) || holdsState(dir) {
		return false, nil // an operator's mount, or state the tmpfs would hide
	}
	// Not nodev: a runtime's probe runs in a bundle made here, and runc makes its device
	// nodes in that root.
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID, stateTmpfs); err != nil {
		return false, fmt.Errorf("mounting a tmpfs at %s: %w", dir, err)
	}
	return true, nil
}

// holdsState reports whether the state directory holds a sandbox's directory or any
// runtime's container state (what a probe or the last boot left is neither).
func holdsState(dir string) bool {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if validID(e.Name()) {
			return true
		}
	}
	runtimes, _ := os.ReadDir(filepath.Join(dir, "runtime"))
	for _, r := range runtimes {
		if inside, _ := os.ReadDir(filepath.Join(dir, "runtime", r.Name())); len(inside) > 0 {
			return true
		}
	}
	return false
}

// sweepStamp, in the state directory, is when a process last swept it (sweepSoon).
const sweepStamp = "last-sweep"

// claimSweep reports whether this process is to sweep the state directory now: no
// process did within every, by the stamp's mtime, which it then sets. A stamp another
// user could have set is not believed (it would put sweeps off).
func (p *Provider) claimSweep(every time.Duration) bool {
	file := filepath.Join(p.stateDir, sweepStamp)
	if fi, err := os.Lstat(file); err == nil {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && fi.Mode().IsRegular() && fi.Mode().Perm()&0o022 == 0 && st.Uid == uint32(os.Geteuid()) &&
			time.Since(fi.ModTime()) < every {
			return false
		}
	}
	if err := statedir.WritePrivate(file, nil); err != nil {
		p.log.Debug("stamping the sweep of the state directory", "file", file, "err", err)
	}
	return true
}
