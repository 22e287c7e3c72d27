package oci_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/oci"
)

// TestProbeCachePlanted: the runtime probe's verdict, kept on disk so that a one-shot
// roche run does not run a probe sandbox each time, is trusted only when root alone could
// have written it. A verdict planted by a second local user (in a state directory others
// may write, sticky or not, into root's file left writable by others, or as a link to a
// file of root's elsewhere) saying crun does not work would turn every oci sandbox away
// (--oci-runtime crun) or onto another runtime; it is ignored, the probe runs again, and
// crun is used. The same verdict written by root, 0600, in a directory only root may
// change, is believed, which shows the test would see a planted one get through.
func TestProbeCachePlanted(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	if _, err := exec.LookPath("crun"); err != nil {
		t.Fatalf("crun: %v (make test installs it)", err)
	}
	// A state directory the second user can reach (its parent 0711), unlike the tests'
	// shared one: the attacker needs a way in for the cases below to mean anything.
	base, err := os.MkdirTemp("/run", "roche-test-probe-")
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(base, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The tmpfs the provider puts its state on where /run is not one.
		if err := unix.Unmount(state, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmounting the state directory's tmpfs: %v", err)
		}
		os.RemoveAll(base)
	})
	// resolve opens a provider anew on state, as a new process would, and resolves crun.
	resolve := func(t *testing.T) error {
		t.Helper()
		p, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"), oci.WithRuntime(oci.RuntimeCrun))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		_, err = p.Runtime(context.Background())
		return err
	}
	if err := resolve(t); err != nil {
		t.Fatalf("crun does not pass the probe here: %v", err)
	}
	file := filepath.Join(state, "probe-crun.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the probe's verdict was not kept: %v", err)
	}
	if fi, err := os.Lstat(file); err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("the probe's verdict: %v %v, want root's, 0600", fi.Mode(), err)
	}
	var verdict map[string]any
	if err := json.Unmarshal(b, &verdict); err != nil {
		t.Fatal(err)
	}
	const plantedErr = "planted verdict: crun is broken here"
	verdict["err"] = plantedErr
	planted, _ := json.Marshal(verdict)

	_, uid, gid := testenv.LocalUser(t, "rocheprb")
	asAttacker := func(t *testing.T) {
		t.Helper()
		cmd := exec.Command("sh", "-c", `umask 077; printf '%s' "$1" > "$2"`, "sh", string(planted), file)
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
	cases := []struct {
		name  string
		plant func(t *testing.T)
	}{
		{"by another user in a sticky directory", func(t *testing.T) {
			os.Remove(file)
			chmodState(t, 0o777|os.ModeSticky)
			asAttacker(t)
		}},
		{"by another user in a directory others may write", func(t *testing.T) {
			os.Remove(file)
			chmodState(t, 0o777)
			asAttacker(t)
			// The attacker's file, made root's: the directory alone gives it away.
			if err := os.Chown(file, 0, 0); err != nil {
				t.Fatal(err)
			}
		}},
		{"into root's file left writable by others", func(t *testing.T) {
			chmodState(t, 0o711)
			if err := os.WriteFile(file, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, 0o666); err != nil {
				t.Fatal(err)
			}
			asAttacker(t)
		}},
		{"as a link to a root-owned file", func(t *testing.T) {
			elsewhere := filepath.Join(t.TempDir(), "verdict")
			if err := os.WriteFile(elsewhere, planted, 0o600); err != nil {
				t.Fatal(err)
			}
			os.Remove(file)
			if err := os.Symlink(elsewhere, file); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.plant(t)
			if err := resolve(t); err != nil {
				t.Errorf("a planted verdict was believed: %v", err)
			}
			// The probe ran again and kept its own verdict in place of the planted one.
			if b, err := os.ReadFile(file); err != nil || strings.Contains(string(b), plantedErr) {
				t.Errorf("the verdict on disk after the probe: %q %v", b, err)
			}
		})
	}
	t.Run("control: root's own verdict is believed", func(t *testing.T) {
		os.Remove(file)
		if err := os.WriteFile(file, planted, 0o600); err != nil {
			t.Fatal(err)
		}
		err := resolve(t)
		if err == nil || !strings.Contains(err.Error(), plantedErr) {
			t.Fatalf("root's own verdict was not used (%v): the cases above prove nothing", err)
		}
		os.Remove(file)
	})
}
