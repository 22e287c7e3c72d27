package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// qemu is qemu-system-x86_64 with the microvm machine: no PCI, no firmware to speak of,
// virtio devices on MMIO, booted straight into an ELF kernel (PVH).
type qemu struct {
	mu    sync.Mutex
	probe *kvmProbe // the result of the KVM probe, once run
	warn  sync.Once
}

const qemuBinary = "qemu-system-x86_64"

// qemuKernelArgs: a serial console for boot errors, no PCI probing (microvm has none),
// and on panic or reboot (how the agent powers off) an immediate reset, which -no-reboot
// turns into QEMU exiting. ACPI stays on: it is how microvm describes its virtio-mmio
// devices to a kernel, like Debian's, built without CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES.
const qemuKernelArgs = "console=ttyS0 quiet panic=-1 reboot=t pci=off tsc=reliable no_timer_check"

func (q *qemu) name() string { return QEMU }

func (q *qemu) binary(p *Provider) (string, error) {
	bin := p.binary
	if bin == "" {
		bin = qemuBinary
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%w: %s not found: install it (apt-get install qemu-system-x86)", roche.ErrUnavailable, bin)
	}
	return path, nil
}

func (q *qemu) check(p *Provider) error {
	_, err := q.binary(p)
	return err
}

// accel decides between KVM and TCG for this provider, probing KVM once.
func (q *qemu) accel(ctx context.Context, p *Provider, a *bootAssets, bin string) (string, error) {
	if p.accel == AccelTCG {
		return AccelTCG, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	fresh := false
	if q.probe == nil {
		r, cached := probeKVM(ctx, p, a, bin)
		if err := ctx.Err(); err != nil {
			return "", err // a cancelled probe proves nothing; the next Create probes again
		}
		q.probe, fresh = &r, !cached
	}
	if q.probe.Usable {
		return AccelKVM, nil
	}
	if p.accel == AccelKVM {
		return "", fmt.Errorf("%w: KVM is not usable here: %s; use acceleration auto or tcg (ROCHE_VM_ACCEL)", roche.ErrUnavailable, q.probe.Reason)
	}
	q.warn.Do(func() {
		// Warned when the probe ran (once per host boot); a process reusing its cached
		// verdict says it only at info level, so every CLI call is not a warning.
		level := slog.LevelInfo
		if fresh {
			level = slog.LevelWarn
		}
		p.log.Log(ctx, level, "KVM is not usable; VMs run under TCG emulation, which boots in seconds instead of milliseconds", "reason", q.probe.Reason)
	})
	return AccelTCG, nil
}

// kvmCPU is the CPU model the KVM probe booted with.
func (q *qemu) kvmCPU() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.probe == nil {
		return "host"
	}
	return q.probe.CPU
}

// argv is the QEMU command line of a VM.
func (q *qemu) argv(p *Provider, vm *plan, bin, accel, cpu string) []string {
	kernelArgs := qemuKernelArgs
	if khz := hostTSCkHz(); accel == AccelTCG && khz > 0 {
		// Emulated, the guest's TSC is the host's, but calibrating it against the
		// emulated PIT fails when the host is busy, and the kernel then hangs at boot
		// with no clock. The host knows the frequency: pass it.
		kernelArgs += " tsc_early_khz=" + strconv.FormatInt(khz, 10)
	}
	machine := "microvm"
	var memArgs []string
	size := strconv.FormatInt(vm.memMiB, 10) + "M"
	switch {
	case vm.Mem != "":
		// RAM in a file: a VM's own (share=on) is its memory snapshot as it stands; a
		// snapshot's mapped privately (share=off) is copy-on-write, so forks share
		// the pages none of them writes.
		share := "on"
		if vm.MemPrivate {
			share = "off"
		}
		machine += ",memory-backend=ram"
		memArgs = []string{"-object", "memory-backend-file,id=ram,size=" + size + ",mem-path=" + qemuEscape(vm.Mem) + ",share=" + share}
	case vm.MemPrivate:
		// Restored from a stream that carries the RAM: plain memory, named as the
		// saved VM's was.
		machine += ",memory-backend=ram"
		memArgs = []string{"-object", "memory-backend-ram,id=ram,size=" + size}
	}
	if vm.incoming != "" {
		// The saved state is read once QMP has set the same migration capabilities
		// that wrote it (startIncoming); the supervisor passes it as fd 4.
		memArgs = append(memArgs, "-incoming", "defer")
	}
	args := []string{bin,
		"-M", machine, "-m", strconv.FormatInt(vm.memMiB, 10) + "M", "-smp", strconv.Itoa(vm.vcpus),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", vm.assets.vmlinux, "-initrd", vm.initrd,
		"-append", strings.TrimSpace(kernelArgs + " " + p.kernelArgs),
		"-serial", "stdio",
		"-drive", "id=root,file=" + qemuEscape(vm.rootfs) + ",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-device,drive=root",
		// The agent's link: fd 3 is the supervisor's socket pair.
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=agent,fd=3",
		"-device", "virtserialport,chardev=agent,name=" + vmlink.SerialPortName,
		"-qmp", "unix:" + qemuEscape(filepath.Join(vm.Dir, "qmp.sock")) + ",server=on,wait=off",
	}
	args = append(args, memArgs...)
	if accel == AccelKVM {
		args = append(args, "-accel", "kvm")
		if cpu != "" {
			args = append(args, "-cpu", cpu)
		}
	} else {
		// "max" gives emulated code every CPU feature TCG has (AVX2 and friends that
		// Python wheels may assume).
		args = append(args, "-accel", "tcg", "-cpu", "max")
	}
	// Defence in depth for the host: QEMU's own seccomp filter, and, when started as
	// root, QEMU drops to nobody once its devices are open.
	sandbox := "on,obsolete=deny,spawn=deny,resourcecontrol=deny"
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("nobody"); err == nil {
			args = append(args, "-runas", "nobody")
		}
	} else {
		sandbox += ",elevateprivileges=deny"
	}
	return append(args, "-sandbox", sandbox)
}

// hostTSCkHz is the host's TSC frequency in kHz where the TSC ticks at a constant rate
// (then /proc/cpuinfo's "cpu MHz" is that rate), else 0.
func hostTSCkHz() int64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || !bytes.Contains(b, []byte(" constant_tsc")) {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || mhz <= 0 {
				return 0
			}
			return int64(mhz * 1000)
		}
	}
	return 0
}

// qemuEscape doubles commas, QEMU's option separator, in a path.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// prepare decides the acceleration (probing KVM the first time).
func (q *qemu) prepare(ctx context.Context, p *Provider, a *bootAssets) error {
	bin, err := q.binary(p)
	if err != nil {
		return err
	}
	_, err = q.accel(ctx, p, a, bin)
	return err
}

func (q *qemu) start(ctx context.Context, p *Provider, vm *plan) (int, error) {
	bin, err := q.binary(p)
	if err != nil {
		return 0, err
	}
	accel := vm.Accel // a restore runs as the saved VM did
	if vm.incoming == "" {
		if accel, err = q.accel(ctx, p, vm.assets, bin); err != nil {
			return 0, err
		}
	}
	vm.Accel = accel
	cmd, err := p.supervisorCmd(vm, supervisor.Spec{
		Argv: q.argv(p, vm, bin, accel, q.kvmCPU()), Serial: true, AgentSocket: filepath.Join(vm.Dir, "agent.sock"),
	})
	if err != nil {
		return 0, err
	}
	if cmd, err = p.startSupervisor(cmd); err != nil {
		return 0, fmt.Errorf("%w: starting the VM's supervisor: %v", roche.ErrUnavailable, err)
	}
	// Reap it whenever it ends, so a long-lived caller keeps no zombies.
	go func() { _ = cmd.Wait() }()
	return cmd.Process.Pid, nil
}

func (q *qemu) client(m meta) *guest.Client {
	return guest.NewClient(filepath.Join(m.Dir, "agent.sock"))
}

// pause stops or continues the vCPUs through QEMU's monitor protocol (QMP).
func (q *qemu) pause(ctx context.Context, m meta, freeze bool) error {
	command := "cont"
	if freeze {
		command = "stop"
	}
	return qmp(ctx, filepath.Join(m.Dir, "qmp.sock"), command)
}

// qmp runs one QMP command.
func qmp(ctx context.Context, socket, command string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("reaching QEMU's monitor: %w", err)
	}
	defer c.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	_ = c.SetDeadline(deadline)
	r := bufio.NewReader(c)
	// The greeting, then capabilities negotiation, then the command; events may be
	// interleaved and are skipped.
	if _, err := r.ReadBytes('\n'); err != nil {
		return fmt.Errorf("QEMU's monitor greeting: %w", err)
	}
	for _, cmd := range []string{"qmp_capabilities", command} {
		if _, err := fmt.Fprintf(c, `{"execute":%q}`+"\n", cmd); err != nil {
			return err
		}
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return fmt.Errorf("QEMU's monitor, %s: %w", cmd, err)
			}
			var resp struct {
				Return json.RawMessage `json:"return"`
				Error  *struct {
					Desc string `json:"desc"`
				} `json:"error"`
			}
			if json.Unmarshal(line, &resp) != nil {
				continue
			}
			if resp.Error != nil {
				return fmt.Errorf("QEMU's monitor, %s: %s", cmd, resp.Error.Desc)
			}
			if resp.Return != nil {
				break
			}
		}
	}
	return nil
}

// kvmProbe is whether KVM works on this host, cached on disk per host boot.
type kvmProbe struct {
	BootID string `json:"boot_id"`
	Key    string `json:"key"`
	Usable bool   `json:"usable"`
	CPU    string `json:"cpu,omitempty"` // the -cpu model that booted ("" for QEMU's default)
	Reason string `json:"reason,omitempty"`
}

// probeKVM decides whether KVM can run our guests. /dev/kvm opening is not enough: where
// KVM is nested, a VM can be created and still hang at its first instructions. So a
// guest is booted under KVM with a bounded wait: the kernel and initramfs every VM uses,
// with a flag that makes the agent print a marker and power off at once. The result is
// kept on disk for this host boot, so only the first VM after a reboot pays for it.
func probeKVM(ctx context.Context, p *Provider, a *bootAssets, bin string) (r kvmProbe, cached bool) {
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	fi, _ := os.Stat(bin)
	key := fmt.Sprintf("%s|%d|%s", bin, fi.ModTime().UnixNano(), a.key)
	cache := filepath.Join(p.cacheDir, "kvm-probe.json")
	if b, err := os.ReadFile(cache); err == nil && json.Unmarshal(b, &r) == nil &&
		r.BootID == strings.TrimSpace(string(bootID)) && r.Key == key {
		return r, true
	}
	r = kvmProbe{BootID: strings.TrimSpace(string(bootID)), Key: key}
	r.Usable, r.CPU, r.Reason = runKVMProbe(ctx, p, a, bin)
	if ctx.Err() == nil { // a cancelled probe proves nothing
		_ = writeJSON(cache, r)
	}
	return r, false
}

// runKVMProbe boots the probe guest under KVM with each CPU model in turn: the host's
// (fastest, but some nested setups refuse it at once), then QEMU's default. A model
// that fails at once is no verdict on KVM; a guest that does not boot in time is.
func runKVMProbe(ctx context.Context, p *Provider, a *bootAssets, bin string) (usable bool, cpu, reason string) {
	if err := kvmOpens(); err != nil {
		return false, "", err.Error()
	}
	var reasons []string
	for _, model := range []string{"host", ""} {
		ok, hung, why := probeBoot(ctx, p, a, bin, model)
		if ok {
			return true, model, ""
		}
		name := model
		if name == "" {
			name = "default"
		}
		reasons = append(reasons, fmt.Sprintf("-cpu %s: %s", name, why))
		if hung {
			break
		}
	}
	return false, "", strings.Join(reasons, "; ")
}

// probeBoot runs one probe guest, reporting whether it booted or hung.
func probeBoot(ctx context.Context, p *Provider, a *bootAssets, bin, cpu string) (ok, hung bool, reason string) {
	ctx, cancel := context.WithTimeout(ctx, p.probeTime)
	defer cancel()
	args := []string{"-M", "microvm", "-m", "256M", "-smp", "1", "-accel", "kvm",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", a.vmlinux, "-initrd", a.initramfs,
		"-append", qemuKernelArgs + " " + vmlink.ProbeParam, "-serial", "stdio"}
	if cpu != "" {
		args = append(args, "-cpu", cpu)
	}
	cmd := exec.Command(bin, args...)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The probe dies with this process (it drops no credentials, so its Pdeathsig
	// holds), and never before its time: Linux sends that signal when the thread that
	// forked it ends, which a Go thread does when a goroutine locked to it returns. This
	// goroutine keeps its thread until the probe is reaped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return false, false, fmt.Sprintf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			if out.Contains(vmlink.ProbeMarker) {
				return true, false, ""
			}
			return false, false, fmt.Sprintf("QEMU exited (%v) before the guest booted: %s", err, strings.ReplaceAll(lastLines(out.String(), 2), "\n", " "))
		case <-tick.C:
			if out.Contains(vmlink.ProbeMarker) {
				// Booted; it powers itself off, but the answer is known now.
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
				return true, false, ""
			}
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			return false, true, fmt.Sprintf("the guest did not boot within %v (nested virtualization that hangs)", time.Since(start).Round(time.Millisecond))
		}
	}
}

// kvmOpens checks that /dev/kvm can be opened and speaks the stable API.
func kvmOpens() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening /dev/kvm: %w", err)
	}
	defer f.Close()
	const kvmGetAPIVersion = 0xae00
	v, err := unix.IoctlRetInt(int(f.Fd()), kvmGetAPIVersion)
	if err != nil {
		return fmt.Errorf("/dev/kvm: KVM_GET_API_VERSION: %v", err)
	}
	if v != 12 {
		return fmt.Errorf("/dev/kvm speaks KVM API %d, not 12", v)
	}
	return nil
}

// lockedBuffer collects a process's output while it is being read.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 {
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) Contains(s string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Contains(b.buf.Bytes(), []byte(s))
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
