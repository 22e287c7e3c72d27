// Package vm runs Roche sandboxes as microVMs: providers "qemu" (qemu-system-x86_64 -M
// microvm, KVM where it works, else emulation) and "firecracker" (through
// firecracker-go-sdk), which share everything but the hypervisor.
//
// A sandbox is a VM booted from a Debian kernel (uncompressed from its bzImage) and a
// small initramfs holding roche-agent, which is the VM's init and serves the same agent
// protocol as in a container. The root filesystem is the sandbox's Docker image, exported
// through the Engine API into an ext4 image (cached by image id) and attached read-only,
// with a tmpfs /tmp and, when writable, an overlay on a tmpfs. Network off means no NIC
// at all; memory and CPUs size the VM; the agent enforces the PID limit (a pids cgroup
// in the guest), memory (a memory cgroup) and timeouts inside.
//
// Each VM is kept by a small supervisor process (this program run as `PROGRAM
// vm-supervise`, see package supervisor) that owns the hypervisor, so a VM outlives the
// process that created it, stops at the end of its lifetime even if no caller is left,
// and leaves nothing on the host when it ends.
package vm

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/roche-sandbox/roche/internal/guest/guestbin"

	"github.com/docker/docker/client"
)

// Names of the two providers.
const (
	QEMU        = "qemu"
	Firecracker = "firecracker"
)

// Accelerations QEMU can use (WithAccel, or $ROCHE_VM_ACCEL).
const (
	AccelAuto = "auto" // KVM when a bounded probe boot shows it works, else TCG
	AccelKVM  = "kvm"
	AccelTCG  = "tcg" // emulation: slow but works everywhere
)

// options configure a Provider.
type options struct {
	log         *slog.Logger
	agentPath   string
	supervisor  string
	kernel      string
	modulesDir  string
	stateDir    string
	cacheDir    string
	memDirRoot  string
	ramDirRoot  string
	binary      string
	accel       string
	kernelArgs  string
	bootTimeout time.Duration
	probeTime   time.Duration
	mkfs        string
	docker      *client.Client
	egress      bool
}

// Option configures a Provider.
type Option func(*options)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithAgentPath sets the host path of the static roche-agent binary, which becomes each
// VM's init (default guestbin.Path: $ROCHE_AGENT, else roche-agent beside the
// executable, else the executable itself when it carries the agent).
func WithAgentPath(path string) Option { return func(o *options) { o.agentPath = path } }

// WithSupervisor sets the program each VM's supervisor runs as (`PROGRAM vm-supervise
// SPEC`); the default is this process's own executable, whose main must call
// supervisor.RunIfAsked first.
func WithSupervisor(path string) Option { return func(o *options) { o.supervisor = path } }

// WithKernel sets the guest kernel, a bzImage or an ELF vmlinux (default
// $ROCHE_VM_KERNEL, else the newest /boot/vmlinuz-* with its modules installed).
func WithKernel(path string) Option { return func(o *options) { o.kernel = path } }

// WithModulesDir sets the directory of the guest kernel's modules (default
// /lib/modules/VERSION, VERSION read from the kernel).
func WithModulesDir(dir string) Option { return func(o *options) { o.modulesDir = dir } }

// WithStateDir sets where each running VM's directory (sockets, console) lives.
func WithStateDir(dir string) Option { return func(o *options) { o.stateDir = dir } }

// WithCacheDir sets where the uncompressed kernel, the initramfs and the root
// filesystems built from images are kept.
func WithCacheDir(dir string) Option { return func(o *options) { o.cacheDir = dir } }

// WithMemoryDir sets where qemu VMs paused to disk, and snapshots being forked, keep
// their memory and state (default /var/lib/roche/vm for root): on a disk, so that a VM
// paused to disk holds no memory.
func WithMemoryDir(dir string) Option { return func(o *options) { o.memDirRoot = dir } }

// WithRAMDir sets where running qemu VMs' RAM files live (default /dev/shm/roche-vm
// for root): a tmpfs, so that their RAM is memory.
func WithRAMDir(dir string) Option { return func(o *options) { o.ramDirRoot = dir } }

// WithBinary sets the hypervisor binary (default qemu-system-x86_64 or firecracker from
// $PATH).
func WithBinary(path string) Option { return func(o *options) { o.binary = path } }

// WithAccel chooses QEMU's accelerator: AccelAuto (default, or $ROCHE_VM_ACCEL), AccelKVM
// or AccelTCG.
func WithAccel(accel string) Option { return func(o *options) { o.accel = accel } }

// WithKernelArgs appends to the guest kernel's command line (for debugging).
func WithKernelArgs(args string) Option { return func(o *options) { o.kernelArgs = args } }

// WithBootTimeout bounds how long Create waits for a VM's agent (default 90 s, which
// emulation on a loaded machine needs; a KVM boot takes well under a second).
func WithBootTimeout(d time.Duration) Option { return func(o *options) { o.bootTimeout = d } }

// WithKVMProbeTimeout bounds the probe boot that decides whether KVM works (default 10 s).
func WithKVMProbeTimeout(d time.Duration) Option { return func(o *options) { o.probeTime = d } }

// WithEgressProxy lets qemu sandboxes have a network_allowlist (and secrets): this
// process then serves each one's egress proxy (package egress), which must outlive the
// sandbox (roched, roche run). The VM still has no network device: its agent carries
// the sandbox's HTTP proxy connections to the host over its serial link.
func WithEgressProxy() Option { return func(o *options) { o.egress = true } }

// WithDockerClient uses an existing Engine API client to export images.
func WithDockerClient(c *client.Client) Option { return func(o *options) { o.docker = c } }

// ownExecutable is this process's executable, "" when it cannot be told.
func ownExecutable() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return exe
}

func defaultOptions() options {
	o := options{
		log:         slog.New(slog.DiscardHandler),
		agentPath:   guestbin.Path(),
		supervisor:  ownExecutable(),
		stateDir:    defaultDir("/run/roche/vm", "XDG_RUNTIME_DIR", "vm"),
		cacheDir:    defaultDir("/var/cache/roche/vm", "XDG_CACHE_HOME", "vm-cache"),
		accel:       os.Getenv("ROCHE_VM_ACCEL"),
		bootTimeout: 90 * time.Second,
		probeTime:   10 * time.Second,
	}
	if o.accel == "" {
		o.accel = AccelAuto
	}
	return o
}

// defaultDir is rootDir for root, else under $env (or the temp dir). State paths are
// short on purpose: a unix socket path must fit in 108 bytes.
func defaultDir(rootDir, env, leaf string) string {
	if os.Geteuid() == 0 {
		return rootDir
	}
	if d := os.Getenv(env); d != "" {
		return filepath.Join(d, "roche", leaf)
	}
	return filepath.Join(os.TempDir(), "roche-"+strconv.Itoa(os.Geteuid()), leaf)
}
