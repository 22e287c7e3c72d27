// Package sizedfs makes sized filesystems: an ext4 filesystem in a sparse image file,
// loop-mounted. Writing past its size fails with ENOSPC inside the sandbox, and the host's
// disk holds no more than the size (the image is sparse, so it holds what was written).
// This needs only loop devices and ext4, which every Linux host has; the engine-side
// alternatives need project quotas (overlay2's size option: XFS mounted with pquota; or
// ext4 quota), and the kernel here has neither (CONFIG_XFS_QUOTA and CONFIG_QFMT_V2 are
// off). The Docker provider's bounded writable roots and workspaces and the oci
// provider's writable roots live on them, bounded the same way.
package sizedfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
)

// MountNew makes img, a sparse file holding an empty ext4 filesystem of size bytes
// without a journal (a Layer), and loop-mounts it at dir. It fails if img exists.
// Unmount undoes it.
func MountNew(img, dir string, size int64) error {
	if err := CanMount(); err != nil {
		return err
	}
	if err := Make(img, size, Layer); err != nil {
		return err
	}
	return Mount(img, dir)
}

// Kind says how a sized filesystem is made.
type Kind int

const (
	// Layer holds a writable root's changes, which die with the sandbox: no journal.
	Layer Kind = iota
	// Workspace holds files that outlive sandboxes: journalled, so that a crash of the
	// host leaves it consistent.
	Workspace
)

// Make makes img, a sparse file of size bytes holding an empty ext4 filesystem. It fails
// if img exists.
func Make(img string, size int64, kind Kind) error {
	mkfs, err := findTool("mkfs.ext4", "e2fsprogs")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("making the disk image %s: %w", img, err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(img)
		return fmt.Errorf("sizing the disk image %s: %w", img, err)
	}
	// -m 0: no blocks reserved for root, the sandbox gets the whole size. Lazy
	// initialisation keeps the image sparse (mkfs writes a few MiB at most); 4 KiB
	// blocks and an inode per 16 KiB keep the filesystem's own share small at any size.
	args := []string{"-q", "-F", "-m", "0", "-b", "4096", "-i", "16384",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"}
	if kind == Layer {
		args = append(args, "-O", "^has_journal")
	}
	out, err := exec.Command(mkfs, append(args, img)...).CombinedOutput()
	if err != nil {
		os.Remove(img)
		return fmt.Errorf("%w: mkfs.ext4 %s: %v: %s", roche.ErrUnavailable, img, err, bytes.TrimSpace(out))
	}
	return nil
}

// Mount loop-mounts the ext4 filesystem in img at dir. The loop device is released when
// the filesystem is unmounted (mount's autoclear), by Roche or by the engine.
func Mount(img, dir string) error {
	mnt, err := findTool("mount", "mount")
	if err != nil {
		return err
	}
	// nosuid, nodev: nothing in a sandbox's files acts as a device or gains privileges
	// on the host side.
	out, err := exec.Command(mnt, "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", img, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: mounting %s at %s: %v: %s", roche.ErrUnavailable, img, dir, err, bytes.TrimSpace(out))
	}
	return nil
}

// Unmount unmounts dir (which releases its loop device); busy reports a filesystem still
// in use (a sandbox has it). Unmounting what is not mounted is not an error.
func Unmount(dir string) (busy bool, err error) {
	err = unix.Unmount(dir, 0)
	if errors.Is(err, unix.EBUSY) {
		return true, fmt.Errorf("unmounting %s: %w", dir, err)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: not mounted
		return false, fmt.Errorf("unmounting %s: %w", dir, err)
	}
	return false, nil
}

// findTool finds a program in PATH or the sbin directories, which a daemon's PATH may lack.
func findTool(name, pkg string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s is not installed, and sized disks need it: apt-get install %s", roche.ErrUnavailable, name, pkg)
}

// CanMount reports why this process cannot mount filesystems, or nil.
func CanMount() error {
	if os.Geteuid() != 0 {
		return errors.New("mounting a filesystem needs root")
	}
	return nil
}

// Available reports why sized filesystems cannot be made here, or nil, each reason a
// roche.Remedy with its fix where a command gives it: root, mkfs.ext4 and mount, and the
// loop devices' control file. roche doctor reports it for the providers that use them.
func Available() error {
	if err := CanMount(); err != nil {
		return fmt.Errorf("%w: sized disks: %v: run roche as root, or through roched", roche.ErrUnavailable, err)
	}
	for _, t := range []struct{ name, pkg string }{{"mkfs.ext4", "e2fsprogs"}, {"mount", "mount"}} {
		if _, err := findTool(t.name, t.pkg); err != nil {
			return &roche.Remedy{Err: err, Run: "apt-get install " + t.pkg, AsRoot: true}
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return &roche.Remedy{Err: fmt.Errorf("%w: no loop devices (%v), and sized disks are loop-mounted", roche.ErrUnavailable, err),
			Run: "modprobe loop", AsRoot: true}
	}
	return nil
}
