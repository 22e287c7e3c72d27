//go:build linux

package vm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
	"github.com/roche-sandbox/roche/provider/vm"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// The VM tests boot real guests. Under emulation (no usable KVM, as on the development
// machine) a boot takes seconds, so they live in this one package and each boots as few
// VMs as it can: the conformance suite shares one VM between the checks that allow it.

func TestMain(m *testing.M) {
	// The provider runs each VM's supervisor as this test binary.
	supervisor.RunIfAsked()
	os.Exit(testenv.RunWithAgent(m))
}

func testConfig() roche.Config {
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	return cfg
}

// newQEMU returns a qemu provider whose VMs live in a directory of the test's own, so
// that nothing else on the machine (a `roche gc --all` from another test run) reaps them.
func newQEMU(t *testing.T, opts ...vm.Option) *vm.Provider {
	t.Helper()
	testenv.Needs(t, testenv.QEMU, testenv.Root, testenv.Docker)
	p, err := vm.NewQEMU(append([]vm.Option{vm.WithStateDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Available(); err != nil {
		t.Fatalf("%v (the README's test command installs qemu-system-x86)", err)
	}
	return p
}

// TestConformanceQEMU runs the conformance suite against the qemu provider: KVM where it
// works, emulation (with a warning) where it does not. The provider serves egress
// proxies, as in roched, so the egress checks run too; the host-side search for the
// brokered secret reads the memory of the VM's QEMU process, which maps the guest's RAM.
func TestConformanceQEMU(t *testing.T) {
	state := t.TempDir()
	p := newQEMU(t, vm.WithStateDir(state), vm.WithEgressProxy())
	providertest.Run(t, p, providertest.Options{Config: testConfig(), VM: true, PidsExact: true, HostPIDs: hypervisorPID(state)})
}

// hypervisorPID returns the pid of the QEMU process of a VM whose state directory is
// below state: the process whose memory holds the guest's RAM (mapped from its file),
// its kernel's, its agent's and its programs' pages, and QEMU's own buffers of the
// serial link.
func hypervisorPID(state string) func(id string) ([]int, error) {
	return func(id string) ([]int, error) {
		pid, _ := supervisor.ReadHypervisor(filepath.Join(state, id))
		if pid <= 0 {
			return nil, fmt.Errorf("no hypervisor recorded in %s", filepath.Join(state, id))
		}
		return []int{pid}, nil
	}
}

// TestConformanceFirecracker runs the suite against Firecracker where there is one. No
// package source here has a firecracker binary, so on this machine it skips, saying why.
func TestConformanceFirecracker(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	p, err := vm.NewFirecracker()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Available(); err != nil {
		if !errors.Is(err, roche.ErrUnavailable) {
			t.Fatalf("Available: %v, want nil or ErrUnavailable", err)
		}
		t.Skip(err)
	}
	providertest.Run(t, p, providertest.Options{Config: testConfig(), VM: true, PidsExact: true})
}

// leftovers lists what a failed create must not leave: entries in the state directory,
// and processes (a supervisor or a hypervisor) naming it.
func leftovers(t *testing.T, stateDir string) []string {
	t.Helper()
	var out []string
	entries, _ := os.ReadDir(stateDir)
	for _, e := range entries {
		out = append(out, "state: "+e.Name())
	}
	return append(out, processesNaming(stateDir)...)
}

// processesNaming lists the processes whose command line contains s.
func processesNaming(s string) []string {
	var out []string
	for _, p := range pidsNaming(s) {
		out = append(out, "process: "+p.cmdline)
	}
	return out
}

// namedProcess is a process found by pidsNaming: its pid and command line.
type namedProcess struct {
	pid     int
	cmdline string
}

// pidsNaming finds the processes, this one aside, whose command line contains s.
func pidsNaming(s string) []namedProcess {
	var out []namedProcess
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			out = append(out, namedProcess{pid, strings.ReplaceAll(string(cmdline), "\x00", " ")})
		}
	}
	return out
}

// checkNothingLeft waits briefly (a killed process takes a moment to go) and then fails
// the test if anything is left.
func checkNothingLeft(t *testing.T, stateDir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := leftovers(t, stateDir)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a failed create left behind:\n%s", strings.Join(left, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestKernelPanicReported boots a guest whose kernel panics (it is told to run an init
// that does not exist, then finds no root): Create must say so and leave nothing.
func TestKernelPanicReported(t *testing.T) {
	state := t.TempDir()
	p := newQEMU(t, vm.WithStateDir(state), vm.WithKernelArgs("rdinit=/no-such-init"))
	start := time.Now()
	_, err := p.Create(context.Background(), testConfig())
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("Create with a panicking guest kernel: %v, want ErrUnavailable saying it panicked", err)
	}
	if el := time.Since(start); el > time.Minute {
		t.Errorf("the panic took %v to be reported: it should end the VM at once", el)
	}
	t.Logf("error: %.300s", err)
	checkNothingLeft(t, state)
}

// TestMissingKernel: a kernel path that does not exist is a clear error naming what to
// install, before anything is started.
func TestMissingKernel(t *testing.T) {
	state := t.TempDir()
	p := newQEMU(t, vm.WithStateDir(state), vm.WithKernel("/no/such/vmlinuz"), vm.WithCacheDir(t.TempDir()))
	_, err := p.Create(context.Background(), testConfig())
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "linux-image-amd64") || !strings.Contains(err.Error(), "/no/such/vmlinuz") {
		t.Fatalf("Create with a missing kernel: %v, want ErrUnavailable naming the path and linux-image-amd64", err)
	}
	checkNothingLeft(t, state)
}

// TestMissingImage: an image the engine does not have is ErrImageNotFound, saying how to
// build one.
func TestMissingImage(t *testing.T) {
	state := t.TempDir()
	p := newQEMU(t, vm.WithStateDir(state))
	cfg := testConfig()
	cfg.Image = "roche/no-such-image:missing"
	_, err := p.Create(context.Background(), cfg)
	if !errors.Is(err, roche.ErrImageNotFound) || !strings.Contains(err.Error(), "make it on this host with roche image build python (as root)") {
		t.Fatalf("Create from a missing image: %v, want ErrImageNotFound with how to build one", err)
	}
	checkNothingLeft(t, state)
}

// TestUnsupportedConfigs: what a VM cannot honour is refused, each reason named.
func TestUnsupportedConfigs(t *testing.T) {
	p := newQEMU(t, vm.WithStateDir(t.TempDir()))
	for name, mod := range map[string]func(*roche.Config){
		"network":     func(c *roche.Config) { c.Network = true },
		"mounts":      func(c *roche.Config) { c.Mounts = []roche.Mount{{Source: "/tmp", Target: "/mnt"}} },
		"cpus=0.5":    func(c *roche.Config) { c.CPUs = 0.5 },
		"memory=100m": func(c *roche.Config) { c.Memory = "100m" },
	} {
		cfg := testConfig()
		mod(&cfg)
		_, err := p.Create(context.Background(), cfg)
		if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), strings.Split(name, "=")[0]) {
			t.Errorf("%s: %v, want ErrUnsupported naming it", name, err)
		}
	}
}

// TestForcedKVMWhereUnusable: asking for KVM where a guest does not boot under it is a
// clear error after a bounded probe, not a hang. A stand-in QEMU that never boots makes
// this certain on any machine; the probe must give up in its time and kill it.
func TestForcedKVMWhereUnusable(t *testing.T) {
	state, bin := t.TempDir(), t.TempDir()
	fake := filepath.Join(bin, "qemu-hangs")
	// Never exits and never prints: what a guest that hangs at its first instruction
	// looks like from outside.
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nwhile :; do sleep 1; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := newQEMU(t, vm.WithStateDir(state), vm.WithCacheDir(t.TempDir()), vm.WithBinary(fake),
		vm.WithAccel(vm.AccelKVM), vm.WithKVMProbeTimeout(2*time.Second))
	start := time.Now()
	_, err := p.Create(context.Background(), testConfig())
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "KVM is not usable") {
		t.Fatalf("Create with KVM forced and unusable: %v, want ErrUnavailable saying KVM is not usable", err)
	}
	if el := time.Since(start); el > time.Minute {
		t.Errorf("the probe took %v, not bounded by its 2 s limit", el)
	}
	t.Logf("error: %v", err)
	checkNothingLeft(t, state)
	for _, l := range processesNaming(bin) {
		t.Errorf("the probe left %s", l)
	}
}

// TestInsideTheVM checks what is particular to a VM sandbox, from inside one: its own
// host name resolves, the sandbox's commands sit in the guest cgroup that carries the
// limits, the seccomp filter refuses what it should, and the agent's other APIs
// (files, background processes) work over the VM's transport.
func TestInsideTheVM(t *testing.T) {
	p := newQEMU(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.Env = map[string]string{"PATH": "/usr/bin:/bin:/roche-test"} // the image sets PATH too
	info, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), info.ID)
	run := func(code string) string {
		t.Helper()
		res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", code}, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %+v %v", code, res, err)
		}
		return strings.TrimSpace(res.Stdout)
	}
	if got := run("import socket; print(socket.gethostname(), socket.gethostbyname(socket.gethostname()))"); got != info.ID+" 127.0.1.1" {
		t.Errorf("host name and address %q, want %q", got, info.ID+" 127.0.1.1")
	}
	if got := run("import os; print(os.environ['PATH'], os.environ['HOME'])"); got != "/usr/bin:/bin:/roche-test /tmp" {
		t.Errorf("PATH and HOME %q: the sandbox's PATH must win over the image's, HOME be the writable /tmp", got)
	}
	if got := run("print(open('/proc/self/cgroup').read().strip())"); got != "0::/sandbox" {
		t.Errorf("cgroup %q, want 0::/sandbox", got)
	}
	if got := run(`
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
out = ['unshare=' + ('allowed' if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()])]
try:
    open('/etc/hosts', 'a'); out.append('hosts=allowed')
except OSError as e:
    out.append('hosts=' + errno.errorcode[e.errno])
print(' '.join(out))`); got != "unshare=EPERM hosts=EACCES" {
		t.Errorf("refusals %q, want unshare=EPERM hosts=EACCES", got)
	}

	if err := p.WriteFile(ctx, info.ID, "/tmp/in/data.bin", strings.NewReader("binary\x00data"), 0o640); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if err := p.ReadFile(ctx, info.ID, "/tmp/in/data.bin", &back); err != nil || back.String() != "binary\x00data" {
		t.Fatalf("read back %q %v", back.String(), err)
	}
	if fi, err := p.Stat(ctx, info.ID, "/tmp/in/data.bin"); err != nil || fi.Size != 11 || fi.Mode.Perm() != 0o640 {
		t.Fatalf("stat %+v %v", fi, err)
	}
	if err := p.WriteFile(ctx, info.ID, "/etc/x", strings.NewReader("x"), 0o644); !errors.Is(err, roche.ErrPermission) {
		t.Fatalf("write on the read-only root: %v, want ErrPermission", err)
	}

	cmd, err := p.StartCommand(ctx, info.ID, roche.CommandRequest{Cmd: []string{"sh", "-c", "echo started; sleep 1; echo done"}})
	if err != nil {
		t.Fatal(err)
	}
	out, end, err := providertest.FollowCommand(ctx, t, p, info.ID, roche.CommandSelector{PID: cmd.PID}, roche.CommandOffsets{})
	if err != nil || end.ExitCode != 0 || out.Stdout.String() != "started\ndone\n" {
		t.Fatalf("connect: %+v %s %v", end, out, err)
	}
}

// TestLifetimeEndsTheVM: with nobody left to destroy it, a VM stops at the end of its
// lifetime and leaves nothing on the host, as a container removes itself.
func TestLifetimeEndsTheVM(t *testing.T) {
	state := t.TempDir()
	p := newQEMU(t, vm.WithStateDir(state))
	cfg := testConfig()
	cfg.TimeoutSecs = 10
	info, err := p.Create(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	deadline := info.ExpiresAt.Add(30 * time.Second)
	for len(leftovers(t, state)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("30 s past its lifetime the VM is still there:\n%s", strings.Join(leftovers(t, state), "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if el := time.Since(info.ExpiresAt); el < -time.Second {
		t.Fatalf("the VM stopped %v before its lifetime ended", -el)
	}
	if _, err := p.Inspect(context.Background(), info.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("Inspect after the lifetime: %v, want ErrNotFound", err)
	}
}

// TestSupervisorKilled: if a VM's supervisor is killed outright, at any moment of the
// VM's life, its hypervisor dies with it (the kernel kills it: the supervisor is the
// init of the VM's PID namespace), and the next List clears what was left on the host.
// The host is loaded meanwhile, as in a full test run, where the hypervisor once
// outlived its supervisor: QEMU's -runas had cleared the Pdeathsig that was to kill it,
// and the guest, which powers itself off when its serial link goes, was too slow to.
func TestSupervisorKilled(t *testing.T) {
	state := t.TempDir()
	p := newQEMU(t, vm.WithStateDir(state))
	// Whatever happens, nothing this test started outlives it: not a process, not a
	// VM's memory file (the List after the kill removes it).
	t.Cleanup(func() {
		killProcessesNaming(t, state)
		for deadline := time.Now().Add(10 * time.Second); len(processesNaming(state)) > 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = p.List(context.Background())
	})
	loadCPUs(t)
	ctx := context.Background()

	supervisorOf := func(id string) int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(state, id, supervisor.PIDFile))
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 1 {
			t.Fatalf("the supervisor's pid file says %q", b)
		}
		return pid
	}
	// gone waits a bounded time for every process of the VMs to end, then lists.
	gone := func(moment string, killed time.Time) {
		t.Helper()
		deadline := killed.Add(20 * time.Second)
		for len(processesNaming(state)) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if left := processesNaming(state); len(left) > 0 {
			t.Fatalf("%s: the hypervisor outlived its supervisor by 20 s:\n%s", moment, strings.Join(left, "\n"))
		}
		t.Logf("%s: the VM's processes were gone %v after the kill", moment, time.Since(killed).Round(time.Millisecond))
		list, err := p.List(ctx)
		if err != nil || len(list) != 0 {
			t.Fatalf("%s: List after the supervisor died: %v %v, want nothing", moment, list, err)
		}
		checkNothingLeft(t, state)
	}

	for round := range 2 {
		// During the boot, before the agent answers: as the hypervisor starts (first
		// round), then once the guest kernel prints (second round; QEMU has dropped to
		// nobody by then).
		booting := make(chan error, 1)
		go func() {
			_, err := p.Create(ctx, testConfig())
			booting <- err
		}()
		killed, killedAt := false, time.Time{}
		for deadline := time.Now().Add(5 * time.Minute); !killed && time.Now().Before(deadline); {
			select {
			case err := <-booting:
				t.Fatalf("round %d: Create ended (%v) before its supervisor could be killed during the boot", round, err)
			default:
			}
			entries, _ := os.ReadDir(state)
			for _, e := range entries {
				dir := filepath.Join(state, e.Name())
				sup := readPIDFile(filepath.Join(dir, supervisor.PIDFile))
				hv, _ := supervisor.ReadHypervisor(dir)
				if sup <= 0 || hv <= 0 {
					continue
				}
				if fi, err := os.Stat(filepath.Join(dir, "console.log")); round > 0 && (err != nil || fi.Size() == 0) {
					continue
				}
				if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killed, killedAt = true, time.Now()
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if !killed {
			t.Fatal("the booting VM's hypervisor never started")
		}
		gone(fmt.Sprintf("round %d, killed during the boot", round), killedAt)
		if err := <-booting; err == nil {
			t.Errorf("round %d: Create succeeded although its supervisor was killed during the boot", round)
		}

		// Once created, idle.
		info, err := p.Create(ctx, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		killedAt = time.Now()
		if err := syscall.Kill(supervisorOf(info.ID), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		gone(fmt.Sprintf("round %d, killed once created", round), killedAt)
		if _, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) {
			t.Fatalf("Exec in the dead VM: %v, want ErrNotFound", err)
		}

		// During a command.
		info, err = p.Create(ctx, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		running := make(chan error, 1)
		go func() {
			_, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "touch /tmp/started; sleep 300"}, Timeout: 10 * time.Minute})
			running <- err
		}()
		testenv.Eventually(t, time.Minute, "the command to run in the VM", func() bool {
			_, err := p.Stat(ctx, info.ID, "/tmp/started")
			return err == nil
		})
		killedAt = time.Now()
		if err := syscall.Kill(supervisorOf(info.ID), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		gone(fmt.Sprintf("round %d, killed during a command", round), killedAt)
		if err := <-running; err == nil {
			t.Errorf("round %d: the command in the killed VM ended without an error", round)
		}

		// Paused: the guest cannot power itself off when its link goes, as a guest
		// that will not (a compromised one) does not. Only the host can end it.
		info, err = p.Create(ctx, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Pause(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
		killedAt = time.Now()
		if err := syscall.Kill(supervisorOf(info.ID), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		gone(fmt.Sprintf("round %d, killed while paused", round), killedAt)
	}
}

func readPIDFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// loadCPUs keeps every CPU busy until the test ends, as a full test run does: twice as
// many busy loops as CPUs, in child processes of this test, which it kills at the end.
func loadCPUs(t *testing.T) {
	t.Helper()
	for range 2 * runtime.NumCPU() {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}

// killProcessesNaming kills, by pid, the processes whose command line names dir (a test's
// own state directory): a failed test must not leave its VMs running.
func killProcessesNaming(t *testing.T, dir string) {
	for _, p := range pidsNaming(dir) {
		t.Logf("killing what the test left: %d %s", p.pid, p.cmdline)
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
}
