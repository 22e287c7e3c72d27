//go:build linux

package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/defaults"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/vm"
)

// TestMemorySnapshotsThroughRoched: through a real roched serving qemu and docker, a code
// context's variable survives roche pause --to-disk and roche resume, a fork made with
// roche fork has it too and goes with roche destroy, and bad input (an unknown id, -n 0,
// a docker sandbox) is one line on stderr and a non-zero exit.
func TestMemorySnapshotsThroughRoched(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.QEMU)
	shm := func() string {
		dir, err := os.MkdirTemp("/dev/shm", "roche-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	// The VMs' state in the test's own directories (nothing else reaps them), their
	// memory on a tmpfs, off the shared machine's disk.
	qemu, err := vm.NewQEMU(vm.WithStateDir(t.TempDir()), vm.WithMemoryDir(shm()), vm.WithRAMDir(shm()))
	if err != nil {
		t.Fatal(err)
	}
	if err := qemu.Available(); err != nil {
		qemu.Close()
		t.Fatalf("%v (the README's test command installs qemu-system-x86)", err)
	}
	docker, err := testLocal.Open("docker", catalog.Options{EngineTimeout: defaults.EngineTimeout, Transport: defaults.Transport})
	if err != nil {
		qemu.Close()
		t.Fatal(err)
	}
	socket := filepath.Join(socketDir(t), "roched.sock")
	d, err := daemon.New(daemon.Config{Socket: socket}, map[string]roche.Provider{"qemu": qemu, "docker": docker})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Shutdown(context.Background())
		catalog.Set{"qemu": qemu, "docker": docker}.Close()
	})
	via := func(args ...string) result {
		t.Helper()
		return run(t, append([]string{"--socket", socket}, args...)...)
	}
	create := func(provider string) string {
		t.Helper()
		r := via("create", "--provider", provider, "--image", testImage())
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create --provider %s through roched: %+v", provider, r)
		}
		t.Cleanup(func() { via("destroy", id) })
		return id
	}
	code := func(id, src string) string {
		t.Helper()
		r := via("code", "--sandbox", id, src)
		if r.code != 0 {
			t.Fatalf("code %q in %s: %+v", src, id, r)
		}
		return strings.TrimSpace(r.stdout)
	}
	// oneLineError: the command failed with one line on stderr that says want.
	oneLineError := func(r result, want string, args ...string) {
		t.Helper()
		msg := strings.TrimSpace(r.stderr)
		if r.code == 0 || strings.Count(msg, "\n") > 0 || !strings.Contains(msg, want) || strings.Contains(msg, "goroutine") {
			t.Errorf("roche %s: %+v, want a non-zero exit and one line on stderr saying %q", strings.Join(args, " "), r, want)
		}
	}
	bad := func(want string, args ...string) {
		t.Helper()
		oneLineError(via(args...), want, args...)
	}

	id := create("qemu")
	code(id, "x = 41")

	if r := via("pause", "--to-disk", id); r.code != 0 {
		t.Fatalf("pause --to-disk: %+v", r)
	}
	if sb, ok := listJSON(t, "--socket", socket)[id]; !ok || sb.State != roche.StatePaused {
		t.Fatalf("roche list after pause --to-disk: %+v (listed %v), want paused", sb, ok)
	}
	if r := via("resume", id); r.code != 0 {
		t.Fatalf("resume: %+v", r)
	}
	if got := code(id, "print(x + 1)"); got != "42" {
		t.Fatalf("after pause --to-disk and resume, x + 1 printed %q, want 42", got)
	}

	r := via("fork", id)
	fork := strings.TrimSpace(r.stdout)
	if r.code != 0 || fork == "" || strings.Contains(fork, "\n") || fork == id {
		t.Fatalf("fork: %+v, want one new id", r)
	}
	t.Cleanup(func() { via("destroy", fork) })
	if sb, ok := listJSON(t, "--socket", socket)[fork]; !ok || sb.State != roche.StateRunning {
		t.Fatalf("roche list after fork: %+v (listed %v), want the fork running, the caller's", sb, ok)
	}
	if got := code(fork, "x += 100; print(x)"); got != "141" {
		t.Fatalf("in the fork, x printed %q, want 141 (41 from its origin, plus 100)", got)
	}
	if got := code(id, "print(x)"); got != "41" {
		t.Fatalf("in the origin after its fork changed x, x printed %q, want 41", got)
	}
	if r := via("destroy", fork); r.code != 0 {
		t.Fatalf("destroy the fork: %+v", r)
	}
	if _, ok := listJSON(t, "--socket", socket)[fork]; ok {
		t.Fatal("roche list still shows the destroyed fork")
	}
	bad("no sandbox", "exec", "--sandbox", fork, "--", "true")

	bad("no sandbox", "fork", "qemu-000000000000")
	bad("no sandbox", "pause", "--to-disk", "qemu-000000000000")
	bad("no sandbox", "resume", "qemu-000000000000")
	bad("give 1 to 64", "fork", id, "-n", "0")
	bad("give 1 to 64", "fork", id, "-n", "65")
	dockerID := create("docker")
	for _, args := range [][]string{{"pause", "--to-disk", dockerID}, {"resume", dockerID}, {"fork", dockerID}} {
		bad("memory snapshots are the vm provider's (qemu) only", args...)
	}
}
