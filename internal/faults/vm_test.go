package faults

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/provider/docker"
)

// vmStateDir is where the qemu provider keeps its VMs when run as root.
const vmStateDir = "/run/roche/vm"

// TestQEMURunKilledLeavesNoVM: roche run --provider qemu killed outright (SIGKILL) while
// its command runs leaves its microVM for the lease's grace, not its lifetime: the
// agent in the guest loses the lease roche held, powers the VM off, and the VM's
// supervisor removes what it had on the host. It boots one VM under emulation (slow):
// run it alone.
func TestQEMURunKilledLeavesNoVM(t *testing.T) {
	img := privateImage(t)
	cmd := exec.Command(filepath.Join(binDir, "roche"), "run", "--provider", "qemu", "--image", img,
		"--", "sh", "-c", "echo started; sleep 600")
	cmd.Env = append(os.Environ(), noDaemon(t)...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	started := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != "started\n" {
			err = os.ErrInvalid
		}
		started <- err
	}()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("waiting for the command in the VM: %v (stderr %q)", err, stderr.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the VM's command had not started after 3 minutes (stderr %q)", stderr.String())
	}
	dir := vmDirOf(t, img)
	defer func() {
		// Whatever the outcome, the VM this test made is stopped.
		if _, err := os.Stat(dir); err == nil {
			exec.Command(filepath.Join(binDir, "roche"), "--direct", "destroy", filepath.Base(dir)).Run()
		}
	}()

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed := time.Now()
	// The grace, then the agent stops the command (up to 2 s for it to exit on SIGTERM)
	// and powers the VM off; the supervisor sees QEMU exit and removes the directory.
	bound := docker.LeaseGrace + 5*time.Second
	eventually(t, bound+margin, "the VM to be gone", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err) && len(processesNaming(dir)) == 0
	})
	t.Logf("the VM %s was gone %v after roche run was killed", filepath.Base(dir), time.Since(killed).Round(100*time.Millisecond))
}

// vmDirOf finds the directory of the one VM made from img.
func vmDirOf(t *testing.T, img string) string {
	t.Helper()
	entries, err := os.ReadDir(vmStateDir)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(vmStateDir, e.Name(), "meta.json"))
		if err != nil {
			continue
		}
		var m struct {
			Image string `json:"image"`
		}
		if json.Unmarshal(b, &m) == nil && m.Image == img {
			found = append(found, filepath.Join(vmStateDir, e.Name()))
		}
	}
	if len(found) != 1 {
		t.Fatalf("VMs made from %s: %v, want one", img, found)
	}
	return found[0]
}

// processesNaming lists the processes whose command line names dir.
func processesNaming(dir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), dir) {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}
