package server

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// chownRoot hands everything on the root filesystem that belongs to uid from over to
// uid (and to gid where its group is from's own, from). It never enters another mount
// (/proc, /dev, /tmp, a workspace, host paths bound in), whose files are not the
// snapshot's, and never follows a symlink: lchown, and a walk that does not enter links.
// It runs before the agent serves, when no program of the sandbox is running yet, so
// nothing can move the tree under it.
func chownRoot(from, uid, gid int) error {
	mounts, err := mountPoints()
	if err != nil {
		return err
	}
	return chownTree("/", mounts, from, uid, gid)
}

// chownTree is chownRoot's walk of the tree at root, entering none of mounts.
func chownTree(root string, mounts map[string]bool, from, uid, gid int) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a directory that cannot be read, or an entry gone since it was listed
		}
		if p != root && mounts[p] {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil // a file bound in from elsewhere (/etc/hosts, a host file)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || int(st.Uid) != from {
			return nil
		}
		g := int(st.Gid)
		if g == from {
			g = gid
		}
		if err := unix.Lchown(p, uid, g); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	})
}

// mountPoints lists where something is mounted, from /proc/self/mountinfo.
func mountPoints() (map[string]bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("listing mounts: %w", err)
	}
	defer f.Close()
	points := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mount-point options ...
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			points[unescapeMountinfo(fields[4])] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("listing mounts: %w", err)
	}
	return points, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space, ...) of mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
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
