package docker

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
)

// Sized filesystems: an ext4 filesystem in a sparse image file, loop-mounted. Writing
// past its size fails with ENOSPC inside the sandbox, and the host's disk holds no more
// than the size (the image is sparse, so it holds what was written). This needs only
// loop devices and ext4, which every Linux host has; the engine-side alternatives need
// project quotas (overlay2's size option: XFS mounted with pquota; or ext4 quota), and
// the kernel here has neither (CONFIG_XFS_QUOTA and CONFIG_QFMT_V2 are off).

// fsKind says how a sized filesystem is made.
type fsKind int

const (
	// layerFS holds a writable root's changes, which die with the sandbox: no journal.
	layerFS fsKind = iota
	// workspaceFS holds files that outlive sandboxes: journalled, so that a crash of
	// the host leaves it consistent.
	workspaceFS
)

// makeExt4 makes img, a sparse file of size bytes holding an empty ext4 filesystem. It
// fails if img exists.
func makeExt4(img string, size int64, kind fsKind) error {
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
	if kind == layerFS {
		args = append(args, "-O", "^has_journal")
	}
	out, err := exec.Command(mkfs, append(args, img)...).CombinedOutput()
	if err != nil {
		os.Remove(img)
		return fmt.Errorf("%w: mkfs.ext4 %s: %v: %s", roche.ErrUnavailable, img, err, bytes.TrimSpace(out))
	}
	return nil
}

// mountImage loop-mounts the ext4 filesystem in img at dir. The loop device is released
// when the filesystem is unmounted (mount's autoclear), by Roche or by the engine.
func mountImage(img, dir string) error {
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

// unmount unmounts dir. busy reports a filesystem still in use (a sandbox has it).
func unmount(dir string) (busy bool, err error) {
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

// sizeLayerDir puts a filesystem of size bytes under an overlay2 layer directory of a
// container that has not started yet, so that its upper and work directories, and so
// every change the sandbox makes to its root, live on it. What the engine put in the
// directory at create (its link and lower files, the empty diff and work directories)
// is recreated on the new filesystem; the originals stay underneath, so the directory is
// whole again whenever the filesystem is not mounted. The image file sits in the layer
// directory too: when the engine removes the container it unmounts what is mounted
// there and deletes the directory, image included, and nothing of it is left.
func sizeLayerDir(layer string, size int64) error {
	var top unix.Stat_t
	if err := unix.Lstat(layer, &top); err != nil {
		return fmt.Errorf("reading the layer directory %s: %w", layer, err)
	}
	if mounted, err := isMountPoint(layer); err != nil || mounted {
		return fmt.Errorf("the layer directory %s is already a mount point (or unreadable: %v)", layer, err)
	}
	entries, err := snapshotLayer(layer)
	if err != nil {
		return err
	}
	img := filepath.Join(layer, layerImage)
	if err := makeExt4(img, size, layerFS); err != nil {
		return err
	}
	if err := mountImage(img, layer); err != nil {
		os.Remove(img)
		return err
	}
	undo := func(err error) error {
		if _, uerr := unmount(layer); uerr == nil {
			os.Remove(img)
		}
		return err
	}
	if err := os.Remove(filepath.Join(layer, "lost+found")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return undo(fmt.Errorf("preparing the sized layer: %w", err))
	}
	for _, e := range entries {
		if err := e.recreate(layer); err != nil {
			return undo(fmt.Errorf("preparing the sized layer: %w", err))
		}
	}
	if err := os.Chmod(layer, os.FileMode(top.Mode&0o7777)); err != nil {
		return undo(err)
	}
	if err := os.Lchown(layer, int(top.Uid), int(top.Gid)); err != nil {
		return undo(err)
	}
	return nil
}

// layerEntry is one thing overlay2 made in a new layer directory.
type layerEntry struct {
	rel      string
	mode     uint32
	uid, gid int
	data     []byte // a regular file's contents; nil for a directory
}

// snapshotLayer reads what overlay2 made in a container's layer directory before it
// started: small files and empty directories. Anything else means the layer is not the
// fresh one this expects, and nothing is changed.
func snapshotLayer(layer string) ([]layerEntry, error) {
	var entries []layerEntry
	const maxFile = 64 << 10
	err := filepath.WalkDir(layer, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == layer {
			return nil
		}
		rel, _ := filepath.Rel(layer, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		e := layerEntry{rel: rel, mode: st.Mode & 0o7777, uid: int(st.Uid), gid: int(st.Gid)}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFREG:
			if st.Size > maxFile {
				return fmt.Errorf("%s holds %d bytes: the layer is not a fresh one", p, st.Size)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.data = b
		default:
			return fmt.Errorf("%s is neither a file nor a directory: the layer is not a fresh one", p)
		}
		if strings.HasPrefix(rel, "diff"+string(filepath.Separator)) {
			return fmt.Errorf("%s: the layer's diff is not empty, so the container has already run", p)
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the layer directory %s: %w", layer, err)
	}
	return entries, nil
}

// recreate makes e again below root, with its mode and owner.
func (e layerEntry) recreate(root string) error {
	p := filepath.Join(root, e.rel)
	if e.data == nil {
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
	} else if err := os.WriteFile(p, e.data, 0o600); err != nil {
		return err
	}
	if err := os.Lchown(p, e.uid, e.gid); err != nil {
		return err
	}
	return unix.Chmod(p, e.mode)
}

// sameFilesystem reports whether a and b are on one filesystem by what statfs says of
// them: the root of a running container (through /proc/PID/root, where overlayfs
// answers with its upper filesystem's figures) against its sized layer.
func sameFilesystem(a, b string) (bool, error) {
	var sa, sb unix.Statfs_t
	if err := unix.Statfs(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Statfs(b, &sb); err != nil {
		return false, err
	}
	return sa.Blocks == sb.Blocks && sa.Bsize == sb.Bsize && sa.Files == sb.Files, nil
}

// canMount reports why this process cannot mount filesystems, or nil.
func canMount() error {
	if os.Geteuid() != 0 {
		return errors.New("mounting a filesystem needs root")
	}
	return nil
}

// lockFile takes an exclusive lock on file, made if missing, and returns its release. A
// lock on a file that was removed meanwhile (by the holder, when it removed what the
// lock guards) is not a lock on the path any more, so it is taken again.
func lockFile(file string) (func(), error) {
	for {
		f, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			return nil, err
		}
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(file, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return func() { f.Close() }, nil
		}
		f.Close()
	}
}

// goferPid finds the gofer of the gVisor sandbox whose kernel runs as sandboxPid: runsc
// starts both from the same parent, the gofer's command line naming "gofer" and the
// container id.
func goferPid(sandboxPid int, id string) (int, error) {
	parent := func(pid string) string {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return ""
		}
		// The fields after the command's name, which may hold spaces, in parentheses.
		_, rest, _ := strings.Cut(string(b), ") ")
		if f := strings.Fields(rest); len(f) > 1 {
			return f[1]
		}
		return ""
	}
	want := parent(strconv.Itoa(sandboxPid))
	if want == "" {
		return 0, fmt.Errorf("the gVisor sandbox's process %d is gone", sandboxPid)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == sandboxPid || parent(e.Name()) != want {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmd, []byte("gofer")) && bytes.Contains(cmd, []byte(id)) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no gofer beside the gVisor sandbox's process %d", sandboxPid)
}
