package server

import (
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// throughProc reports whether the working directory dir is in /proc or is reached
// through it, such as /proc/self/fd/N or a symlink to it. A command changes to its
// working directory after the agent forks it and before it execs, while it still
// holds every descriptor the agent has open (they close at exec), so /proc/self/fd/N
// is then a directory the agent holds: the cgroup a microVM's agent clones commands
// into, or whatever a later version opens. That is CVE-2024-21626's way out of a
// container, so such a directory is refused before the fork. Symlinks are followed as
// chdir follows them; a path that does not resolve is left for chdir to report.
func throughProc(dir string) bool {
	if dir == "" {
		return false
	}
	cur, rest := "/", dir
	for hops := 0; ; {
		if onProc(cur) {
			return true
		}
		var comp string
		comp, rest, _ = strings.Cut(strings.TrimLeft(rest, "/"), "/")
		if comp == "" {
			return false
		}
		if comp == "." {
			continue
		}
		// cur holds no symlink, so ".." is its lexical parent, as the kernel takes it.
		next := path.Join(cur, comp)
		fi, err := os.Lstat(next)
		if err != nil {
			return false
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return false // chdir fails with ELOOP
		}
		target, err := os.Readlink(next)
		if err != nil {
			return false
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		rest = target + "/" + rest
	}
}

// onProc reports whether p is on a proc filesystem.
func onProc(p string) bool {
	var st unix.Statfs_t
	return unix.Statfs(p, &st) == nil && st.Type == unix.PROC_SUPER_MAGIC
}

// checkWorkdir refuses a working directory in /proc or reached through it.
func checkWorkdir(dir string) error {
	if throughProc(dir) {
		return invalid("working directory %s is in /proc or reached through it, where a command could start in a directory the agent holds open: give a directory of the sandbox's files", dir)
	}
	return nil
}
