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
	// A state directory the second user can reach, unlike the tests' shared one.
	state := testenv.ReachableStateDir(t, "/run", "roche-test-probe-")
	t.Cleanup(func() {
		// The tmpfs the provider puts its state on where /run is not one.
		if err := unix.Unmount(state, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmounting the state directory's tmpfs: %v", err)
		}
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

	for _, plant := range testenv.Plants(t, state, file, planted, "rocheprb") {
		t.Run(plant.Name, func(t *testing.T) {
			plant.Do(t)
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
		testenv.PlantOwn(t, file, planted)
		err := resolve(t)
		if err == nil || !strings.Contains(err.Error(), plantedErr) {
			t.Fatalf("root's own verdict was not used (%v): the cases above prove nothing", err)
		}
		os.Remove(file)
	})
}
