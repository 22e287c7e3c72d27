// Package statedir makes the directories where providers keep what reaches a sandbox
// from the host (roche-agent's socket, the egress proxy's, QEMU's monitor), and refuses
// one that another local user could swap. A provider run by a user without
// XDG_RUNTIME_DIR keeps them under /tmp/roche-UID, a name anyone may take first: a
// directory made there by another user, or one others may write, would let them replace
// a sandbox's directory with their own and answer in its agent's place.
package statedir

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/roche-sandbox/roche"
)

// Make makes dir (0700) and its missing parents, then checks it (Check). What exists of
// it is checked first, so that nothing is made under a directory that is refused.
func Make(dir string) error {
	existing := filepath.Clean(dir)
	for {
		if _, err := os.Lstat(existing); err == nil || existing == filepath.Dir(existing) {
			break
		}
		existing = filepath.Dir(existing)
	}
	if err := Check(existing); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%w: making %s: %v", roche.ErrUnavailable, dir, err)
	}
	return Check(dir)
}

// Check makes sure that only this process's user and root own dir and every directory
// above it (through any symbolic link), that no one else may write them, and that a
// directory others may write (/tmp) is sticky, so that no one else can rename or
// replace what is in it.
func Check(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", roche.ErrUnavailable, dir, err)
	}
	me := uint32(os.Geteuid())
	for d := real; ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", roche.ErrUnavailable, d, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		mode := fi.Mode()
		switch {
		case st.Uid != me && st.Uid != 0:
			return refused(dir, d, fmt.Sprintf("belongs to uid %d", st.Uid))
		case mode.Perm()&0o022 != 0 && mode&os.ModeSticky == 0:
			return refused(dir, d, fmt.Sprintf("may be written by others (mode %v)", mode.Perm()))
		}
		if d == "/" || d == filepath.Dir(d) {
			return nil
		}
	}
}

func refused(dir, d, why string) error {
	return fmt.Errorf("%w: %s %s: another local user could replace what Roche keeps in %s (sandboxes' sockets); remove it, or set XDG_RUNTIME_DIR to a directory of your own",
		roche.ErrUnavailable, d, why, dir)
}
