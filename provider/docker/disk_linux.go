package docker

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/provider/internal/sizedfs"
)

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
	if err := sizedfs.Make(img, size, sizedfs.Layer); err != nil {
		return err
	}
	if err := sizedfs.Mount(img, layer); err != nil {
		os.Remove(img)
		return err
	}
	undo := func(err error) error {
		if _, uerr := sizedfs.Unmount(layer); uerr == nil {
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
