package vm

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	firecracker "github.com/firecracker-microvm/firecracker-go-sdk"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	"github.com/sirupsen/logrus"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// firecrackerVMM is Firecracker, driven through firecracker-go-sdk: the SDK starts the
// VMM (wrapped in the supervisor), configures it over its API socket and boots it. The
// agent is reached over Firecracker's hybrid vsock. When a jailer binary sits beside
// firecracker (or on $PATH), the VMM runs jailed: chrooted, as nobody, in its own
// namespaces and cgroup.
type firecrackerVMM struct{}

const (
	firecrackerBinary = "firecracker"
	// Firecracker's documented guest command line (reboot=k: a reboot goes to its i8042
	// device, which makes the VMM exit), plus no probing for the PS/2 devices it lacks.
	firecrackerKernelArgs = "console=ttyS0 quiet reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd"
	// guestCID is the guest's vsock address; each VM has its own vsock device, so every
	// guest can use the same one.
	guestCID = 3
	// jailUID is who a jailed VMM runs as.
	jailUID = 65534
)

func (f *firecrackerVMM) name() string { return Firecracker }

func (f *firecrackerVMM) binary(p *Provider) (string, error) {
	bin := p.binary
	if bin == "" {
		bin = firecrackerBinary
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%w: no %s binary: Debian does not package it; install a release from https://github.com/firecracker-microvm/firecracker/releases onto $PATH, or use --provider qemu",
			roche.ErrUnavailable, bin)
	}
	return path, nil
}

// jailer returns the jailer binary, if there is one.
func (f *firecrackerVMM) jailer(fcBin string) string {
	if j := filepath.Join(filepath.Dir(fcBin), "jailer"); isExecutable(j) {
		return j
	}
	if j, err := exec.LookPath("jailer"); err == nil {
		return j
	}
	return ""
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// check: a firecracker binary and a /dev/kvm that works. Firecracker has no emulation to
// fall back to.
func (f *firecrackerVMM) check(p *Provider) error {
	if _, err := f.binary(p); err != nil {
		return err
	}
	if err := kvmOpens(); err != nil {
		return fmt.Errorf("%w: firecracker needs KVM: %v", roche.ErrUnavailable, err)
	}
	return nil
}

// firecrackerConfig maps a VM plan onto the SDK's configuration: no network interface
// at all, the root filesystem as a read-only non-root drive (the initramfs mounts it),
// whole vCPUs without SMT, the memory size, and one vsock device for the agent.
func firecrackerConfig(vm *plan, extraArgs string) firecracker.Config {
	return firecracker.Config{
		VMID:            vm.ID,
		SocketPath:      vm.API,
		KernelImagePath: vm.assets.vmlinux,
		InitrdPath:      vm.initrd,
		KernelArgs:      strings.TrimSpace(firecrackerKernelArgs + " " + extraArgs),
		Drives: []models.Drive{{
			DriveID:      firecracker.String("root"),
			PathOnHost:   firecracker.String(vm.rootfs),
			IsRootDevice: firecracker.Bool(false),
			IsReadOnly:   firecracker.Bool(true),
		}},
		VsockDevices: []firecracker.VsockDevice{{ID: "agent", Path: vm.Vsock, CID: guestCID}},
		MachineCfg: models.MachineConfiguration{
			VcpuCount:  firecracker.Int64(int64(vm.vcpus)),
			MemSizeMib: firecracker.Int64(vm.memMiB),
			Smt:        firecracker.Bool(false),
		},
		// The supervisor, not the SDK, handles signals: the VM outlives this process.
		ForwardSignals: []os.Signal{},
	}
}

func (f *firecrackerVMM) prepare(context.Context, *Provider, *bootAssets) error { return nil }

func (f *firecrackerVMM) start(ctx context.Context, p *Provider, vm *plan) (int, error) {
	fcBin, err := f.binary(p)
	if err != nil {
		return 0, err
	}
	vm.Accel = AccelKVM
	vm.API = filepath.Join(vm.Dir, "api.sock")
	vm.Vsock = filepath.Join(vm.Dir, "vsock.sock")
	cfg := firecrackerConfig(vm, p.kernelArgs)
	argv := []string{fcBin, "--api-sock", vm.API, "--id", vm.ID}
	spec := supervisor.Spec{}
	if jailerBin := f.jailer(fcBin); jailerBin != "" && os.Geteuid() == 0 {
		argv, spec.RemoveDirs, err = f.jail(ctx, p, vm, &cfg, fcBin, jailerBin)
		if err != nil {
			return 0, err
		}
	}
	spec.Argv = argv
	cmd, err := p.supervisorCmd(vm, spec)
	if err != nil {
		return 0, err
	}
	quiet := logrus.New()
	quiet.Out = io.Discard
	m, err := firecracker.NewMachine(ctx, cfg, firecracker.WithProcessRunner(cmd), firecracker.WithLogger(logrus.NewEntry(quiet)))
	if err != nil {
		return 0, fmt.Errorf("%w: configuring firecracker: %v", roche.ErrUnavailable, err)
	}
	// The SDK stops the VMM when this context ends, so it lives as long as the VMM does.
	vmmCtx, cancel := context.WithCancel(context.Background())
	if err := m.Start(vmmCtx); err != nil {
		cancel()
		if cmd.Process != nil {
			p.stopSupervisor(cmd.Process.Pid, vm.Dir)
		}
		return 0, fmt.Errorf("%w: starting firecracker: %v", roche.ErrUnavailable, err)
	}
	// The SDK waits for (and so reaps) the process it started.
	go func() { _ = m.Wait(context.Background()); cancel() }()
	return cmd.Process.Pid, nil
}

// jail runs firecracker under its jailer. The SDK hard-links the kernel, initrd and root
// filesystem into the chroot, which therefore lives on the cache's filesystem; the
// per-VM initrd moves there too, readable by the jailed user.
// It returns the jailer's command line and the directories to remove with the VM.
func (f *firecrackerVMM) jail(ctx context.Context, p *Provider, vm *plan, cfg *firecracker.Config, fcBin, jailerBin string) ([]string, []string, error) {
	base := filepath.Join(p.cacheDir, "jailer")
	staging := filepath.Join(base, "staging-"+vm.ID)
	remove := []string{staging, filepath.Join(base, filepath.Base(fcBin), vm.ID)}
	if err := os.MkdirAll(staging, 0o700); err != nil {
		return nil, nil, err
	}
	initrd := filepath.Join(staging, "initrd")
	if err := os.Rename(vm.initrd, initrd); err != nil {
		return nil, remove, err
	}
	if err := os.Chown(initrd, jailUID, jailUID); err != nil {
		return nil, remove, err
	}
	vm.initrd = initrd
	cfg.InitrdPath = initrd
	workspace := filepath.Join(base, filepath.Base(fcBin), vm.ID, "root")
	cgroupVersion := "1"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		cgroupVersion = "2"
	}
	uid, gid, numa := jailUID, jailUID, 0
	cfg.SocketPath = "api.sock" // inside the chroot; the SDK maps it to the host path
	cfg.VsockDevices[0].Path = "/vsock.sock"
	cfg.JailerCfg = &firecracker.JailerConfig{
		ID: vm.ID, UID: &uid, GID: &gid, NumaNode: &numa, ExecFile: fcBin, JailerBinary: jailerBin,
		ChrootBaseDir: base, CgroupVersion: cgroupVersion,
		ChrootStrategy: firecracker.NewNaiveChrootStrategy(vm.assets.vmlinux),
	}
	vm.API = filepath.Join(workspace, "api.sock")
	vm.Vsock = filepath.Join(workspace, "vsock.sock")
	cmd := firecracker.NewJailerCommandBuilder().
		WithID(vm.ID).WithUID(uid).WithGID(gid).WithNumaNode(numa).
		WithExecFile(fcBin).WithChrootBaseDir(base).WithCgroupVersion(cgroupVersion).
		WithFirecrackerArgs("--api-sock", "api.sock").WithBin(jailerBin).
		Build(ctx)
	return cmd.Args, remove, nil
}

func (f *firecrackerVMM) client(m meta) *guest.Client {
	return guest.NewClientWithDialer(m.Vsock, func(ctx context.Context) (net.Conn, error) {
		return vmlink.DialHybridVsock(ctx, m.Vsock, vmlink.VsockPort)
	})
}

func (f *firecrackerVMM) pause(ctx context.Context, m meta, freeze bool) error {
	quiet := logrus.New()
	quiet.Out = io.Discard
	c := firecracker.NewClient(m.API, logrus.NewEntry(quiet), false)
	state := models.VMStateResumed
	if freeze {
		state = models.VMStatePaused
	}
	_, err := c.PatchVM(ctx, &models.VM{State: firecracker.String(state)})
	return err
}
