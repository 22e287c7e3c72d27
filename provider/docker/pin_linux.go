//go:build linux

package docker

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
)

// Pinned mounts. The engine binds a mount source by its path when the container starts,
// following every symbolic link on the way. Whoever can write a directory on that path
// (a sandbox with a read-write mount above it) can swap a directory for a link to
// anywhere between the caller's check of the path and the engine's bind. So, with
// WithPinnedMounts, the provider opens the source itself, one component at a time from
// /, refusing any symbolic link, and bind-mounts the very directory (or file) it opened
// at a private staging path under its state directory, which no sandbox can write; the
// engine binds that. What a later swap does to the original path no longer matters. The
// engine cannot be handed the open file descriptor itself: runc's bind mount runs in the
// container's new mount namespace, where a descriptor from the host's is refused (EINVAL).

// pinnedDir is the staging directory's name under the state directory.
const pinnedDir = "pinned"

// pinRootMu serialises making the staging directory a private mount point (so that the
// bind mounts made below it propagate nowhere) and sweeping it.
var pinRootMu sync.Mutex

// pinSource pins src and returns the staging path to bind instead, and the function that
// unpins it once the container has started (the container keeps its own bind).
func (p *Provider) pinSource(src string) (string, func(), error) {
	root, err := p.pinRoot()
	if err != nil {
		return "", nil, err
	}
	fd, isDir, err := openNoFollow(src)
	if err != nil {
		return "", nil, err
	}
	defer unix.Close(fd)
	staged := filepath.Join(root, fmt.Sprintf("%d-%s", os.Getpid(), randomHex(8)))
	if isDir {
		err = os.Mkdir(staged, 0o700)
	} else {
		var f *os.File
		if f, err = os.OpenFile(staged, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
			f.Close()
		}
	}
	if err != nil {
		return "", nil, fmt.Errorf("%w: making a staging point for mount source %s: %v", roche.ErrUnavailable, src, err)
	}
	// /proc/self/fd/N names the opened object itself, whatever its path has become.
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(fd), staged, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		os.Remove(staged)
		return "", nil, fmt.Errorf("%w: pinning mount source %s (roched must run as root to serve host mounts): %v", roche.ErrUnavailable, src, err)
	}
	return staged, func() { unpin(staged) }, nil
}

// unpin removes a staging point: unmounted first, then removed as an empty directory or
// file, never recursively (a still-mounted point would be the source's own content).
func unpin(staged string) {
	if err := unix.Unmount(staged, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return
	}
	os.Remove(staged)
}

// pinRoot returns the staging directory, made a private mount point (a bind of itself)
// on first use, with the staging points of dead processes cleared.
func (p *Provider) pinRoot() (string, error) {
	root := filepath.Join(p.stateDir, pinnedDir)
	pinRootMu.Lock()
	defer pinRootMu.Unlock()
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("%w: making %s: %v", roche.ErrUnavailable, root, err)
	}
	if mounted, _ := isMountPoint(root); !mounted {
		if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
			return "", fmt.Errorf("%w: making %s a mount point (roched must run as root to serve host mounts): %v", roche.ErrUnavailable, root, err)
		}
	}
	if err := unix.Mount("", root, "", unix.MS_PRIVATE, ""); err != nil {
		return "", fmt.Errorf("%w: making %s private: %v", roche.ErrUnavailable, root, err)
	}
	sweepPins(root)
	return root, nil
}

// sweepPins unpins the staging points a crashed process left (named after its pid).
func sweepPins(root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, _, ok := strings.Cut(e.Name(), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n == os.Getpid() {
			continue
		}
		if unix.Kill(n, 0) == unix.ESRCH {
			unpin(filepath.Join(root, e.Name()))
		}
	}
}

// isMountPoint reports whether dir is the mount point of a mount in this namespace
// (a bind mount of a directory onto itself included, which a device comparison misses).
func isMountPoint(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == dir {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// openNoFollow opens path (absolute and clean) as an O_PATH descriptor, walking it one
// component at a time from / and refusing any that is a symbolic link: each step is
// relative to the directory already held, so nothing swapped meanwhile can redirect it.
func openNoFollow(path string) (fd int, isDir bool, err error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return -1, false, fmt.Errorf("%w: mount source %q must be an absolute path without . or .. or a trailing /", roche.ErrInvalidConfig, path)
	}
	fd, err = unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false, fmt.Errorf("opening /: %w", err)
	}
	isDir = true
	walked := ""
	for _, part := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		if part == "" {
			continue // path is "/"
		}
		walked += "/" + part
		if !isDir {
			unix.Close(fd)
			return -1, false, fmt.Errorf("%w: mount source %s: %s is not a directory", roche.ErrInvalidConfig, path, filepath.Dir(walked))
		}
		next, err := unix.Openat(fd, part, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, false, fmt.Errorf("%w: mount source %s: %s: %v", roche.ErrInvalidConfig, path, walked, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			return -1, false, fmt.Errorf("mount source %s: %s: %w", path, walked, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			unix.Close(next)
			return -1, false, fmt.Errorf("%w: mount source %s: %s is a symbolic link: give the path it points to", roche.ErrInvalidConfig, path, walked)
		case unix.S_IFDIR:
			isDir = true
		case unix.S_IFREG:
			isDir = false
		default:
			unix.Close(next)
			return -1, false, fmt.Errorf("%w: mount source %s is neither a directory nor a regular file", roche.ErrInvalidConfig, path)
		}
		fd = next
	}
	return fd, isDir, nil
}
