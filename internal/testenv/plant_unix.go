//go:build unix

package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// ReachableStateDir makes a state directory, 0700, inside a new directory under parent
// that a second local user may pass through (0711), unlike the tests' shared state
// directories: an attacker needs a way in for a planting attack to mean anything. It is
// removed when the test ends.
func ReachableStateDir(t testing.TB, parent, pattern string) string {
	t.Helper()
	base, err := os.MkdirTemp(parent, pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	state := filepath.Join(base, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	return state
}

// A Plant is one way a second local user puts content where a file of private state is
// read.
type Plant struct {
	Name string
	// Do plants; the state directory's mode is set back to 0700 when the test ends.
	Do func(t *testing.T)
}

// Plants returns the ways a second local user (made here, named userPrefix and a random
// suffix) can put content at file, in the state directory state (see ReachableStateDir),
// that a reader of private state (provider/internal/statedir's ReadPrivate) must refuse:
// the user's own file in the directory made sticky and writable by all; the user's file
// made this process's user's, in a directory writable by all (the directory alone gives
// it away); this user's file left writable by others, written by the user; a link to a
// file of this user's elsewhere. A test runs each, checks that the content was not used,
// and also runs a control (the same content written by this user, private) to show that
// it would see planted content get through. Needs root.
func Plants(t *testing.T, state, file string, content []byte, userPrefix string) []Plant {
	t.Helper()
	_, uid, gid := LocalUser(t, userPrefix)
	asAttacker := func(t *testing.T) {
		t.Helper()
		cmd := exec.Command("sh", "-c", `umask 077; cat > "$1"`, "sh", file)
		cmd.Stdin = bytes.NewReader(content)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the attacker's write: %v %s", err, out)
		}
	}
	chmodState := func(t *testing.T, mode os.FileMode) {
		t.Helper()
		if err := os.Chmod(state, mode); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(state, 0o700) })
	}
	return []Plant{
		{"by another user in a sticky directory", func(t *testing.T) {
			os.Remove(file)
			chmodState(t, 0o777|os.ModeSticky)
			asAttacker(t)
		}},
		{"by another user in a directory others may write", func(t *testing.T) {
			os.Remove(file)
			chmodState(t, 0o777)
			asAttacker(t)
			if err := os.Chown(file, os.Geteuid(), os.Getegid()); err != nil {
				t.Fatal(err)
			}
		}},
		{"into our file left writable by others", func(t *testing.T) {
			chmodState(t, 0o711)
			if err := os.WriteFile(file, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, 0o666); err != nil {
				t.Fatal(err)
			}
			asAttacker(t)
		}},
		{"as a link to our file elsewhere", func(t *testing.T) {
			elsewhere := filepath.Join(t.TempDir(), filepath.Base(file))
			if err := os.WriteFile(elsewhere, content, 0o600); err != nil {
				t.Fatal(err)
			}
			os.Remove(file)
			if err := os.Symlink(elsewhere, file); err != nil {
				t.Fatal(err)
			}
		}},
	}
}

// PlantOwn writes content to file as this process's user, 0600, replacing what is there:
// the control of a planting test.
func PlantOwn(t testing.TB, file string, content []byte) {
	t.Helper()
	os.Remove(file)
	if err := os.WriteFile(file, content, 0o600); err != nil {
		t.Fatal(err)
	}
}
