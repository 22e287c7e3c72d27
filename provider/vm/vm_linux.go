package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
	"github.com/roche-sandbox/roche/internal/proctree"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
	"github.com/roche-sandbox/roche/provider/internal/statedir"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

var (
	_ roche.Provider         = (*Provider)(nil)
	_ kit.Creator            = (*Provider)(nil)
	_ roche.FileCopier       = (*Provider)(nil)
	_ roche.TarCopier        = (*Provider)(nil)
	_ roche.FileSystem       = (*Provider)(nil)
	_ roche.BackgroundRunner = (*Provider)(nil)
	_ roche.Pauser           = (*Provider)(nil)
	_ roche.GarbageCollector = (*Provider)(nil)
	_ kit.Leaser             = (*Provider)(nil)
	_ roche.CodeRunner       = (*Provider)(nil)
)

// minMemory is the smallest VM that boots the guest kernel and still leaves the sandbox
// room to run a program.
const minMemory = 128 << 20

// Provider runs sandboxes as microVMs under one hypervisor.
type Provider struct {
	options
	forwarder
	hv hypervisor
	// leases holds the leases of the leased sandboxes this provider made.
	leases guestfwd.Leases
	// proxies are the egress proxies of the sandboxes with an allowlist this process
	// serves (WithEgressProxy), each in its VM's directory.
	proxies egresswire.Proxies
	// snaps are the snapshot directories in use here (snaplock_linux.go).
	snaps snapLocks

	dockerMu  sync.Mutex
	ownDocker bool

	// noPIDNamespace warns, once, that supervisors run without a PID namespace.
	noPIDNamespace sync.Once

	assetsMu sync.Mutex
	assets   *bootAssets

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	// events tells Watch's callers of ends; endWatches is the supervisor pid watched
	// per sandbox (events_linux.go).
	events     kit.EventHub
	endWatches map[string]int
	endFiles   map[*os.File]struct{}
	endClosed  bool
}

// hypervisor is what differs between QEMU and Firecracker.
type hypervisor interface {
	name() string
	// check reports, wrapping roche.ErrUnavailable, why VMs cannot run here.
	check(p *Provider) error
	// prepare runs once the boot assets exist, before anything is built for the VM
	// (QEMU decides between KVM and emulation there).
	prepare(ctx context.Context, p *Provider, a *bootAssets) error
	// start boots the VM and returns the pid of its supervisor, which it reaps.
	start(ctx context.Context, p *Provider, vm *plan) (int, error)
	// client reaches the agent of a running VM.
	client(m meta) *guest.Client
	// pause freezes (or thaws) a VM's vCPUs.
	pause(ctx context.Context, m meta, freeze bool) error
}

// NewQEMU returns the "qemu" provider. It checks nothing: the first Create reports,
// with what to install, whatever is missing.
func NewQEMU(opts ...Option) (*Provider, error) { return newProvider(&qemu{}, opts) }

// NewFirecracker returns the "firecracker" provider (see NewQEMU).
func NewFirecracker(opts ...Option) (*Provider, error) {
	return newProvider(&firecrackerVMM{}, opts)
}

func newProvider(hv hypervisor, opts []Option) (*Provider, error) {
	p := &Provider{options: defaultOptions(), hv: hv, sandboxes: map[string]*sandbox{}}
	p.forwarder = guestfwd.Forwarder{Reach: p.reach}
	for _, o := range opts {
		o(&p.options)
	}
	switch p.accel {
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		return nil, fmt.Errorf("%w: acceleration %q: use auto, kvm or tcg", roche.ErrInvalidConfig, p.accel)
	}
	return p, nil
}

// Close ends its watches of the VMs' ends, lets go of the leases this provider holds
// (those VMs stop within the grace) and releases the Engine API client it opened.
func (p *Provider) Close() error {
	p.stopEndWatches()
	p.proxies.StopAll()
	p.leases.DropAll()
	p.dockerMu.Lock()
	defer p.dockerMu.Unlock()
	if p.ownDocker && p.docker != nil {
		return p.docker.Close()
	}
	return nil
}

// Name implements roche.Provider.
func (p *Provider) Name() string { return p.hv.name() }

// Acceleration reports how this provider's VMs run, "kvm" or "tcg" (QEMU's emulation),
// and why KVM is not used when it is not. For QEMU the first call may boot the KVM
// probe (up to its timeout, once per host boot).
func (p *Provider) Acceleration(ctx context.Context) (accel, whyNotKVM string, err error) {
	if err := p.hv.check(p); err != nil {
		return "", "", err
	}
	q, ok := p.hv.(*qemu)
	if !ok {
		return AccelKVM, "", nil
	}
	a, err := p.bootAssets(ctx)
	if err != nil {
		return "", "", err
	}
	bin, err := q.binary(p)
	if err != nil {
		return "", "", err
	}
	accel, err = q.accel(ctx, p, a, bin)
	if err != nil || accel == AccelKVM {
		return accel, "", err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.probe == nil {
		return accel, "emulation was asked for", nil
	}
	return accel, q.probe.Reason, nil
}

// Available reports, wrapping roche.ErrUnavailable, why this provider cannot run VMs
// here (no hypervisor binary; for Firecracker, no usable /dev/kvm), or nil. It boots
// nothing: whether KVM actually runs a guest is learnt at the first Create.
func (p *Provider) Available() error { return p.hv.check(p) }

// Capabilities implements roche.Provider. A VM has no network interface at all (the
// network option is refused) and no host mounts (a shared filesystem would be a channel
// out of the VM; refused until there is one worth its risk). A qemu VM takes an egress
// allowlist where this process serves its proxy (WithEgressProxy).
func (p *Provider) Capabilities() roche.Capabilities {
	return roche.Capabilities{
		Writable: true, Files: true, Pause: true, Stdin: true, Processes: true, Leases: true,
		Code: guestfwd.CodeLanguages, RichResults: true, Egress: p.egressHere(),
	}
}

// egressHere reports whether this provider's sandboxes may have an egress allowlist:
// qemu's, whose agent carries it over the serial link, in a process that serves the
// proxies (WithEgressProxy).
func (p *Provider) egressHere() bool { return p.egress && p.Name() == QEMU }

func (p *Provider) dockerClient() (*client.Client, error) {
	p.dockerMu.Lock()
	defer p.dockerMu.Unlock()
	if p.docker == nil {
		c, err := engine.DockerClient()
		if err != nil {
			return nil, fmt.Errorf("%w: configuring the Docker client: %v", roche.ErrUnavailable, err)
		}
		p.docker, p.ownDocker = c, true
	}
	return p.docker, nil
}

// refuse rejects what a VM cannot honour without weakening the config.
func (p *Provider) refuse(cfg roche.Config) error {
	var problems []string
	if cfg.Network {
		problems = append(problems, "network=true: a "+p.Name()+" sandbox has no network interface at all; use the docker provider for network access")
	}
	if cfg.FromSnapshot != "" {
		problems = append(problems, "from_snapshot: "+p.Name()+" sandboxes have no snapshots yet; use the docker provider")
	}
	if cfg.Workspace != "" {
		problems = append(problems, "workspace: "+p.Name()+" sandboxes have no persistent workspaces yet; use the docker provider")
	}
	switch {
	case len(cfg.NetworkAllowlist) == 0:
	case p.Name() != QEMU:
		problems = append(problems, "network_allowlist: "+p.Name()+" sandboxes have no egress relay yet (its vsock is not wired to the proxy); use the qemu provider")
	case !p.egress:
		problems = append(problems, "network_allowlist needs a host process that outlives the sandbox to run its proxy: use roched (roche daemon start) or roche run")
	}
	if len(cfg.Mounts) > 0 {
		problems = append(problems, "mounts: a "+p.Name()+" sandbox cannot see host paths; copy files in with cp instead")
	}
	if cfg.CPUs != math.Trunc(cfg.CPUs) {
		problems = append(problems, fmt.Sprintf("cpus=%v: a VM has whole vCPUs; give a whole number", cfg.CPUs))
	}
	if cfg.MemoryBytes() < minMemory {
		problems = append(problems, fmt.Sprintf("memory=%s: a VM needs at least 128m for its kernel and the sandbox", cfg.Memory))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", roche.ErrUnsupported, strings.Join(problems, "; "))
	}
	return nil
}

// bootAssets are the kernel and initramfs every VM boots, built once per provider (and
// cached on disk across processes).
type bootAssets struct {
	version   string
	vmlinux   string
	initramfs string
	key       string // changes with the kernel or the agent
}

func (p *Provider) bootAssets(ctx context.Context) (*bootAssets, error) {
	p.assetsMu.Lock()
	defer p.assetsMu.Unlock()
	if p.assets != nil {
		return p.assets, nil
	}
	if p.agentPath == "" {
		return nil, fmt.Errorf("%w: roche-agent was not found: it is every VM's init; %s", roche.ErrUnavailable, guestbin.Install)
	}
	if err := checkStatic(p.agentPath); err != nil {
		return nil, err
	}
	kpath, err := findKernel(p.kernel)
	if err != nil {
		return nil, err
	}
	img, err := os.ReadFile(kpath)
	if err != nil {
		return nil, fmt.Errorf("%w: reading the guest kernel: %v", roche.ErrUnavailable, err)
	}
	version, err := kernelVersion(img)
	if err != nil && p.modulesDir == "" {
		return nil, fmt.Errorf("%w: guest kernel %s: %v; give its modules directory with WithModulesDir", roche.ErrUnavailable, kpath, err)
	}
	agentBin, err := os.ReadFile(p.agentPath)
	if err != nil {
		return nil, fmt.Errorf("%w: reading roche-agent: %v", roche.ErrUnavailable, err)
	}
	ksum := sha256.Sum256(img)
	h := sha256.New()
	h.Write(ksum[:])
	h.Write(agentBin)
	fmt.Fprintf(h, "%s|%s|%v", p.modulesDir, version, guestModules)
	a := &bootAssets{version: version, key: hex.EncodeToString(h.Sum(nil))[:16]}
	dir := filepath.Join(p.cacheDir, "boot")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: making the cache directory: %v", roche.ErrUnavailable, err)
	}
	a.vmlinux = filepath.Join(dir, "vmlinux-"+hex.EncodeToString(ksum[:])[:16])
	if _, err := os.Stat(a.vmlinux); err != nil {
		vmlinux, err := extractVmlinux(ctx, img)
		if err != nil {
			return nil, fmt.Errorf("%w: uncompressing the guest kernel %s: %v", roche.ErrUnavailable, kpath, err)
		}
		if err := writeAtomic(a.vmlinux, 0o644, func(w io.Writer) error { _, err := w.Write(vmlinux); return err }); err != nil {
			return nil, err
		}
	}
	a.initramfs = filepath.Join(dir, "initramfs-"+a.key+".cpio")
	if _, err := os.Stat(a.initramfs); err != nil {
		mdir := p.modulesDir
		if mdir == "" {
			mdir = filepath.Join("/lib/modules", version)
		}
		mods, err := resolveModules(mdir, guestModules)
		if err != nil {
			return nil, err
		}
		if err := writeAtomic(a.initramfs, 0o644, func(w io.Writer) error {
			return writeBaseInitramfs(ctx, w, p.agentPath, mods)
		}); err != nil {
			return nil, fmt.Errorf("%w: building the initramfs: %v", roche.ErrUnavailable, err)
		}
	}
	p.assets = a
	return a, nil
}

// writeAtomic writes a file through a temporary beside it, so a reader never sees half
// of it and a failure leaves nothing.
func writeAtomic(path string, mode os.FileMode, fill func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	err = fill(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// meta is what a VM's directory records about it, for any process to find.
type meta struct {
	ID         string    `json:"id"`
	Hypervisor string    `json:"hypervisor"`
	Image      string    `json:"image"`
	Config     kit.Spec  `json:"config"`
	CreatedAt  time.Time `json:"created_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Accel      string    `json:"accel,omitempty"`
	Workdir    string    `json:"workdir,omitempty"`
	// Dir is the VM's state directory; Vsock the host side of its vsock (Firecracker),
	// API its API socket.
	Dir   string `json:"dir"`
	Vsock string `json:"vsock,omitempty"`
	API   string `json:"api,omitempty"`
	// Claim is set once a pooled sandbox is claimed for a holder (claim_linux.go);
	// Config's Owner and ExpiresAt are then the claim's.
	Claim *kit.Claim `json:"claim,omitempty"`
	// What a restore from a memory snapshot boots again (snapshot_linux.go): the root
	// filesystem and kernel files, the VM's size, and the file its RAM is mapped from
	// (MemPrivate: a copy-on-write mapping of a snapshot's file, which the VM's writes
	// do not reach, or with no Mem plain memory; else the VM's own file on a tmpfs,
	// its RAM itself).
	Rootfs     string `json:"rootfs,omitempty"`
	Kernel     string `json:"kernel,omitempty"`
	MemMiB     int64  `json:"mem_mib,omitempty"`
	VCPUs      int    `json:"vcpus,omitempty"`
	Mem        string `json:"mem,omitempty"`
	MemPrivate bool   `json:"mem_private,omitempty"`
}

// plan is one VM being created.
type plan struct {
	meta
	assets  *bootAssets
	rootfs  string
	initrd  string
	console string
	vcpus   int
	memMiB  int64
	// report is the write end of the pipe the supervisor reports on (its fd 3).
	report *os.File
	// incoming is a saved VM state to restore, relink the nonce the restored guest
	// waits for (snapshot_linux.go).
	incoming string
	relink   string
	// resuming: a failed start leaves the directories, for the VM is paused to disk
	// and can be resumed again.
	resuming bool
	// trust is what the sandbox's egress proxy gives it (with an allowlist): its CA's
	// files, and the CA variables and the secrets' placeholders for the environment.
	trust egress.Trust
}

// sandbox is what this process knows about a VM.
type sandbox struct {
	meta
	agent *guest.Client
}

var idPattern = regexp.MustCompile(`^(qemu|firecracker)-[0-9a-f]{12}$`)

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Create implements roche.Provider: CreateFor with no owner, not leased.
func (p *Provider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return p.CreateFor(ctx, cfg, kit.CreateOptions{})
}

// CreateFor implements kit.Creator: it returns once the VM's agent answers. On any error
// nothing is left: no process, socket or file.
func (p *Provider) CreateFor(ctx context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	if err := cfg.Validate(); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.refuse(cfg); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.hv.check(p); err != nil {
		return roche.SandboxInfo{}, err
	}
	assets, err := p.bootAssets(ctx)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.hv.prepare(ctx, p, assets); err != nil {
		return roche.SandboxInfo{}, err
	}
	root, err := p.rootfs(ctx, cfg.Image)
	if err != nil {
		return roche.SandboxInfo{}, err
	}

	now := time.Now()
	id := p.Name() + "-" + randomHex(6)
	dir := filepath.Join(p.stateDir, id)
	// The VM's sockets (its agent's, QEMU's monitor) live here: nobody but this user and
	// root may own or write the directories above them.
	if err := statedir.Make(p.stateDir); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: making the VM's directory: %v", roche.ErrUnavailable, err)
	}
	vm := &plan{
		meta: meta{
			ID: id, Hypervisor: p.Name(), Image: cfg.Image, Config: kit.Spec{Config: cfg, CreateOptions: opts}, CreatedAt: now,
			ExpiresAt: now.Add(time.Duration(cfg.TimeoutSecs) * time.Second), Dir: dir,
			Workdir: cfg.Workdir,
		},
		assets: assets, rootfs: root.path,
		initrd: filepath.Join(dir, "initrd"), console: filepath.Join(dir, "console.log"),
		vcpus: int(cfg.CPUs), memMiB: (cfg.MemoryBytes() + 1<<20 - 1) >> 20,
	}
	vm.Rootfs, vm.Kernel, vm.MemMiB, vm.VCPUs = vm.rootfs, assets.vmlinux, vm.memMiB, vm.vcpus
	if p.Name() == QEMU {
		// The VM's RAM is a file of its own, so a memory snapshot of it costs no copy.
		if err := p.makeRAMDir(id); err != nil {
			p.removeDir(dir)
			return roche.SandboxInfo{}, err
		}
		vm.Mem = filepath.Join(p.ramDir(id), "mem")
	}
	if vm.Workdir == "" {
		vm.Workdir = root.workdir
	}
	if len(cfg.NetworkAllowlist) > 0 {
		// Served before the VM boots, in its directory (so it goes with the VM's files);
		// the CA's key and the secrets' values stay in this process.
		if vm.trust, err = p.proxies.Start(dir, dir, id, cfg, p.log); err != nil {
			p.removeDir(dir)
			p.removeMemDir(id)
			return roche.SandboxInfo{}, err
		}
	}
	sb, err := p.boot(ctx, vm, root)
	if err != nil {
		p.proxies.Stop(dir)
		p.removeDir(dir)
		p.removeMemDir(id)
		return roche.SandboxInfo{}, err
	}
	p.remember(sb)
	p.log.Debug("sandbox created", "id", id, "image", cfg.Image, "accel", vm.Accel, "took", time.Since(now).Round(time.Millisecond))
	return sb.info(roche.StateRunning), nil
}

// boot writes the VM's initrd, starts its supervisor and waits for the agent. On error
// the VM is stopped; the caller removes the directory.
func (p *Provider) boot(ctx context.Context, vm *plan, root imageRoot) (*sandbox, error) {
	// The image's environment, then the sandbox's, which wins for a name both set.
	var env []string
	for _, kv := range root.env {
		k, _, _ := strings.Cut(kv, "=")
		if _, set := vm.Config.Env[k]; !set {
			env = append(env, kv)
		}
	}
	for k, v := range vm.Config.Env {
		env = append(env, k+"="+v)
	}
	guest := vmlink.GuestConfig{
		Hostname: vm.ID, User: guestUser(vm.Config.User), Env: env, Workdir: vm.Workdir,
		LifetimeMS: time.Until(vm.ExpiresAt).Milliseconds(), PidsLimit: vm.Config.PidsLimit,
		Writable: vm.Config.Writable, DiskSize: vm.Config.DiskBytes(), TmpSize: vm.Config.TmpSize(), Transport: vmlink.TransportSerial,
	}
	if p.Name() == Firecracker {
		guest.Transport = vmlink.TransportVsock
	}
	if len(vm.Config.NetworkAllowlist) > 0 {
		if err := egressGuest(&guest, vm.trust); err != nil {
			return nil, err
		}
	}
	if vm.Config.Leased {
		// The agent powers the VM off LeaseGrace after its lease is lost, or when this
		// create has not taken it by the end of the boot's deadline.
		guest.LeaseGraceMS = agentspec.LeaseGrace.Milliseconds()
		guest.FirstLeaseMS = agentspec.FirstLease(p.bootTimeout).Milliseconds()
	}
	base, err := os.Open(vm.assets.initramfs)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", roche.ErrUnavailable, err)
	}
	err = writeAtomic(vm.initrd, 0o600, func(w io.Writer) error {
		if _, err := io.Copy(w, base); err != nil {
			return err
		}
		return writeConfigArchive(w, guest)
	})
	base.Close()
	if err != nil {
		return nil, fmt.Errorf("writing the VM's initrd: %w", err)
	}
	return p.launch(ctx, vm, nil)
}

// launch starts the VM's supervisor and waits for its agent; restore, when set, runs
// once the hypervisor is up (a snapshot's restore starts it). On error the VM is
// stopped; the caller removes the directory.
func (p *Provider) launch(ctx context.Context, vm *plan, restore func(context.Context) error) (*sandbox, error) {
	reportR, reportW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer reportR.Close()
	vm.report = reportW
	pid, err := p.hv.start(ctx, p, vm)
	reportW.Close() // the supervisor holds its copy; EOF here means it has gone
	if err != nil {
		return nil, err
	}
	// Without its pid file and meta.json a VM would run untracked: nothing could list,
	// reap or destroy it. So a failed write stops it here.
	err = writeFileSync(filepath.Join(vm.Dir, supervisor.PIDFile), strconv.Itoa(pid))
	if err == nil {
		err = writeJSON(filepath.Join(vm.Dir, "meta.json"), vm.meta)
	}
	if err != nil {
		p.abort(pid, vm)
		return nil, fmt.Errorf("recording the VM's pid and settings in %s: %w", vm.Dir, err)
	}

	sb := &sandbox{meta: vm.meta, agent: p.hv.client(vm.meta)}
	reports := make(chan supervisor.Report, 1)
	go func() {
		var r supervisor.Report
		if err := json.NewDecoder(reportR).Decode(&r); err != nil {
			r.Exit = "the VM's supervisor exited without a report"
		}
		reports <- r
	}()
	bctx, cancel := context.WithTimeout(ctx, p.bootTimeout)
	defer cancel()
	ready := make(chan error, 1)
	go func() {
		if restore != nil {
			if err := restore(bctx); err != nil {
				ready <- err
				return
			}
		}
		ready <- sb.agent.WaitReady(bctx)
	}()
	select {
	case err = <-ready:
		if err != nil {
			console := tail(vm.console, 20)
			if vm.incoming != "" {
				console += p.restoreDiagnosis(vm)
			}
			p.abort(pid, vm)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if restore != nil && !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "did not answer") {
				return nil, fmt.Errorf("%w: restoring the VM: %v; last console lines:\n%s", roche.ErrUnavailable, err, console)
			}
			return nil, fmt.Errorf("%w: the VM's agent did not answer within %v (%s); last console lines:\n%s",
				roche.ErrTimeout, p.bootTimeout, vm.Accel, console)
		}
	case r := <-reports:
		cancel()
		<-ready
		p.abort(pid, vm)
		return nil, bootFailure(r)
	}
	if vm.relink != "" {
		// Restored: the guest learns its new randomness, time, name and lifetime before
		// anyone else reaches it, and lets go of the lease it held across the snapshot.
		err := sb.agent.Restored(bctx, restoredRequest(vm.ID, time.Until(vm.ExpiresAt)))
		if err != nil {
			p.abort(pid, vm)
			return nil, fmt.Errorf("%w: the restored VM's agent: %v", roche.ErrUnavailable, err)
		}
	}
	if vm.Config.Leased {
		if err := p.leases.Take(bctx, vm.ID, sb.agent); err != nil {
			p.abort(pid, vm)
			return nil, err
		}
	}
	return sb, nil
}

var panicLine = regexp.MustCompile(`Kernel panic - not syncing:[^\r\n]*`)

// bootFailure explains a VM that stopped before its agent answered.
func bootFailure(r supervisor.Report) error {
	if m := panicLine.FindString(r.Console); m != "" {
		return fmt.Errorf("%w: the guest kernel panicked at boot: %s (console:\n%s)", roche.ErrUnavailable, m, lastLines(r.Console, 12))
	}
	if i := strings.LastIndex(r.Console, "roche-agent: vm init:"); i >= 0 {
		line, _, _ := strings.Cut(r.Console[i:], "\n")
		return fmt.Errorf("%w: the VM's init failed: %s", roche.ErrUnavailable, strings.TrimSpace(line))
	}
	return fmt.Errorf("%w: the VM stopped during boot (%s); last console lines:\n%s", roche.ErrUnavailable, r.Exit, lastLines(r.Console, 12))
}

// supervisorCmd prepares (without starting) the supervisor of vm running argv.
func (p *Provider) supervisorCmd(vm *plan, spec supervisor.Spec) (*exec.Cmd, error) {
	spec.Dir = vm.Dir
	spec.Console = vm.console
	spec.DeadlineUnixMS = vm.ExpiresAt.Add(10 * time.Second).UnixMilli()
	spec.Incoming, spec.Relink = vm.incoming, vm.relink
	if len(vm.Config.NetworkAllowlist) > 0 {
		spec.EgressSocket = egresswire.Socket(vm.Dir)
	}
	if vm.Mem != "" && !vm.MemPrivate {
		spec.RemoveDirs = append(spec.RemoveDirs, filepath.Dir(vm.Mem))
	}
	specPath := filepath.Join(vm.Dir, supervisor.SpecFile)
	if err := writeJSON(specPath, spec); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(vm.Dir, "supervisor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	if p.supervisor == "" {
		return nil, fmt.Errorf("%w: this process cannot name its own executable to run the VM's supervisor: give one with vm.WithSupervisor", roche.ErrUnavailable)
	}
	cmd := exec.Command(p.supervisor, supervisor.Subcommand, specPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{vm.report}
	// Its own session: the VM must not die with the caller's terminal or process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if os.Geteuid() == 0 {
		// And, as root, its own PID namespace, whose init it is: the kernel kills the
		// hypervisor when the supervisor dies, whatever credentials the hypervisor
		// dropped to (see package supervisor).
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	}
	return cmd, nil
}

// startSupervisor starts a supervisor from supervisorCmd and returns the command that
// runs. Where this process may not make a PID namespace (a container without
// CAP_SYS_ADMIN), that is a second command, without one, said once in a warning: its
// hypervisor then outlives a supervisor killed outright, until a List finds and kills it.
func (p *Provider) startSupervisor(cmd *exec.Cmd) (*exec.Cmd, error) {
	err := cmd.Start()
	if err == nil || cmd.SysProcAttr.Cloneflags&syscall.CLONE_NEWPID == 0 ||
		!(errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC)) {
		return cmd, err
	}
	p.noPIDNamespace.Do(func() {
		p.log.Warn("cannot give the VMs' supervisors a PID namespace of their own: a supervisor killed outright leaves its hypervisor running until a List kills it", "err", err)
	})
	again := exec.Command(cmd.Path, cmd.Args[1:]...)
	again.Stdout, again.Stderr, again.ExtraFiles = cmd.Stdout, cmd.Stderr, cmd.ExtraFiles
	attr := *cmd.SysProcAttr
	attr.Cloneflags &^= syscall.CLONE_NEWPID
	again.SysProcAttr = &attr
	return again, again.Start()
}

func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFileSync(path, string(b))
}

func writeFileSync(path, s string) error {
	return writeAtomic(path, 0o600, func(w io.Writer) error { _, err := io.WriteString(w, s); return err })
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return lastLines(strings.ToValidUTF8(string(b), "?"), n)
}

func (s *sandbox) info(state roche.SandboxState) roche.SandboxInfo {
	return roche.SandboxInfo{
		ID: s.ID, Provider: s.Hypervisor, Image: s.Image, State: state,
		CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt, Transport: "agent", Owner: s.Config.Owner,
		Metadata: s.Config.Metadata,
	}
}

func (p *Provider) remember(s *sandbox) {
	p.mu.Lock()
	p.sandboxes[s.ID] = s
	p.mu.Unlock()
	p.watchEnd(s)
}

func (p *Provider) forget(id string) {
	p.mu.Lock()
	delete(p.sandboxes, id)
	p.mu.Unlock()
}

// lookup finds a running sandbox of this provider by id.
func (p *Provider) lookup(id string) (*sandbox, error) {
	p.mu.Lock()
	s, ok := p.sandboxes[id]
	p.mu.Unlock()
	if ok {
		return s, nil
	}
	if !idPattern.MatchString(id) || !strings.HasPrefix(id, p.Name()+"-") {
		return nil, fmt.Errorf("%w: no %s sandbox %s (listing your sandboxes shows the live ones)", roche.ErrNotFound, p.Name(), id)
	}
	m, alive, err := p.readVM(filepath.Join(p.stateDir, id))
	if err != nil || !alive {
		return nil, fmt.Errorf("%w: no %s sandbox %s (listing your sandboxes shows the live ones)", roche.ErrNotFound, p.Name(), id)
	}
	s = &sandbox{meta: m, agent: p.hv.client(m)}
	p.remember(s)
	p.ensureEgress(s)
	return s, nil
}

// readVM reads a VM directory's meta and whether its supervisor is alive.
func (p *Provider) readVM(dir string) (meta, bool, error) {
	var m meta
	b, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return m, false, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, false, err
	}
	if _, err := os.Stat(filepath.Join(dir, supervisor.SuspendedFile)); err == nil {
		return m, true, nil // paused to disk: no process, but a sandbox to resume
	}
	pid := readPID(filepath.Join(dir, supervisor.PIDFile))
	return m, pid > 0 && isOurProcess(pid, dir, supervisor.Subcommand), nil
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// isOurProcess reports whether pid is alive (not a zombie) and its command line names
// dir (and marker, if given): a recycled pid must never be signalled.
func isOurProcess(pid int, dir, marker string) bool {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(dir)) {
		return false
	}
	if marker != "" && !bytes.Contains(cmdline, []byte(marker)) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
		return false
	}
	return true
}

// abort stops a VM whose start failed; one being resumed keeps its files. The record of
// its end, which its supervisor may have written (a guest kernel that panicked at boot),
// goes too: the sandbox never was, and the create's error says why.
func (p *Provider) abort(pid int, vm *plan) {
	defer os.Remove(supervisor.EndedPath(vm.Dir))
	if !vm.resuming {
		p.stopSupervisor(pid, vm.Dir)
		return
	}
	p.kill(pid, vm.Dir)
	for _, f := range []string{supervisor.PIDFile, supervisor.HypervisorFile, "agent.sock", "qmp.sock"} {
		os.Remove(filepath.Join(vm.Dir, f))
	}
}

// stopSupervisor stops a VM: its supervisor stops the hypervisor and removes the
// directory; if it does not, both are killed and the directory removed here.
func (p *Provider) stopSupervisor(pid int, dir string) {
	p.kill(pid, dir)
	p.removeDir(dir)
}

// kill stops a VM's supervisor and hypervisor.
func (p *Provider) kill(pid int, dir string) {
	if pid > 0 && isOurProcess(pid, dir, supervisor.Subcommand) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(10 * time.Second)
		for isOurProcess(pid, dir, supervisor.Subcommand) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if isOurProcess(pid, dir, supervisor.Subcommand) {
			p.log.Warn("the VM's supervisor did not stop; killing it", "pid", pid, "dir", dir)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if hv := hypervisorOf(dir); hv > 0 {
		_ = syscall.Kill(-hv, syscall.SIGKILL)
		_ = syscall.Kill(hv, syscall.SIGKILL)
	}
}

// hypervisorOf returns the pid of the hypervisor of the VM in dir while it runs, or 0:
// the process its supervisor recorded, if its command line still names dir and it
// started when the record says (an older record has no start time), so that a pid
// reused by another process is never signalled.
func hypervisorOf(dir string) int {
	pid, start := supervisor.ReadHypervisor(dir)
	if pid <= 0 || !isOurProcess(pid, dir, "") {
		return 0
	}
	if start != 0 {
		if now, err := proctree.StartTime(pid); err != nil || now != start {
			return 0
		}
	}
	return pid
}

// removeDir removes a VM directory of ours (and a jailer's chroot it names).
func (p *Provider) removeDir(dir string) {
	if filepath.Dir(dir) != filepath.Clean(p.stateDir) || !idPattern.MatchString(filepath.Base(dir)) {
		return
	}
	if b, err := os.ReadFile(filepath.Join(dir, supervisor.SpecFile)); err == nil {
		var spec supervisor.Spec
		if json.Unmarshal(b, &spec) == nil {
			for _, d := range spec.RemoveDirs {
				_ = os.RemoveAll(d)
			}
		}
	}
	p.removeMemDir(filepath.Base(dir))
	if err := os.RemoveAll(dir); err != nil {
		p.log.Warn("removing a VM directory", "dir", dir, "err", err)
	}
}

// Destroy implements roche.Provider; it is idempotent.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	p.forget(id)
	defer p.leases.Drop(id)
	if !idPattern.MatchString(id) || !strings.HasPrefix(id, p.Name()+"-") {
		return nil
	}
	dir := filepath.Join(p.stateDir, id)
	p.proxies.Stop(dir)
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	p.stopSupervisor(readPID(filepath.Join(dir, supervisor.PIDFile)), dir)
	if !p.watchedEvents() {
		_ = os.Remove(supervisor.EndedPath(dir)) // nobody to tell
	}
	return nil
}

// Keep implements kit.Leaser: the VM's agent ends its lease, so that it lives out its
// lifetime, and the lease this provider held is let go of.
func (p *Provider) Keep(ctx context.Context, id string) error {
	return p.leases.Keep(ctx, p.forwarder, id)
}

// Inspect implements roche.Provider.
func (p *Provider) Inspect(ctx context.Context, id string) (roche.SandboxInfo, error) {
	s, err := p.lookup(id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	if _, alive, err := p.readVM(s.Dir); err != nil || !alive {
		p.forget(id)
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s is gone (destroyed, or its lifetime ended)", roche.ErrNotFound, id)
	}
	return p.infoOf(s), nil
}

func (p *Provider) state(dir string) roche.SandboxState {
	if _, err := os.Stat(filepath.Join(dir, supervisor.SuspendedFile)); err == nil {
		return roche.StatePaused
	}
	if _, err := os.Stat(filepath.Join(dir, "paused")); err == nil {
		return roche.StatePaused
	}
	return roche.StateRunning
}

// List implements roche.Provider. A VM whose supervisor is gone is removed on the way,
// as a container engine removes an auto-remove container that has stopped.
func (p *Provider) List(ctx context.Context) ([]roche.SandboxInfo, error) {
	entries, err := os.ReadDir(p.stateDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return []roche.SandboxInfo{}, nil
		}
		return nil, fmt.Errorf("listing %s: %w", p.stateDir, err)
	}
	p.removeStaleEnds(staleEnd)
	p.sweepSnaps()
	out := []roche.SandboxInfo{}
	for _, e := range entries {
		if !e.IsDir() || !idPattern.MatchString(e.Name()) || !strings.HasPrefix(e.Name(), p.Name()+"-") {
			continue
		}
		dir := filepath.Join(p.stateDir, e.Name())
		m, alive, err := p.readVM(dir)
		if err != nil {
			// No meta yet: a VM still being created. Left a while, then it is stale; at
			// once if its supervisor has died (the create fails then anyway).
			sup := readPID(filepath.Join(dir, supervisor.PIDFile))
			fi, serr := e.Info()
			if (sup > 0 && !isOurProcess(sup, dir, supervisor.Subcommand)) || (serr == nil && time.Since(fi.ModTime()) > 2*time.Minute) {
				p.stopSupervisor(sup, dir)
			}
			continue
		}
		if !alive {
			p.stopSupervisor(0, dir) // its supervisor was killed: clean up after it
			continue
		}
		s := sandbox{meta: m}
		out = append(out, p.infoOf(&s))
	}
	return out, nil
}

// staleEnd is how old an end record of a VM (supervisor.EndedPath) nobody read is when
// List removes it: no process watched that VM (it was made by a CLI that has exited).
const staleEnd = 10 * time.Minute

// GC implements roche.GarbageCollector: it removes expired VMs (every one with All).
func (p *Provider) GC(ctx context.Context, opts roche.GCOptions) ([]roche.SandboxInfo, error) {
	list, err := p.List(ctx)
	if err != nil {
		return nil, err
	}
	return kit.Collect(ctx, list, opts, p.Destroy)
}

// Pause implements roche.Pauser.
func (p *Provider) Pause(ctx context.Context, id string) error { return p.setPaused(ctx, id, true) }

// Unpause implements roche.Pauser.
func (p *Provider) Unpause(ctx context.Context, id string) error {
	return p.setPaused(ctx, id, false)
}

func (p *Provider) setPaused(ctx context.Context, id string, freeze bool) (err error) {
	s, err := p.lookup(id)
	if err != nil {
		return err
	}
	hv := engine.Engine{Name: "the hypervisor of sandbox " + id, Addr: s.Dir,
		Hint: "the VM may be stuck: roche destroy " + id + " stops it"}
	ctx, done := hv.Bound(ctx, "pausing or resuming", engine.ControlTimeout)
	defer done(&err)
	if err := p.hv.pause(ctx, s.meta, freeze); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	marker := filepath.Join(s.Dir, "paused")
	if freeze {
		return os.WriteFile(marker, nil, 0o600)
	}
	if err := os.Remove(marker); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// guestUser is who commands run as in the guest. roche.UserAuto is nobody: a microVM has
// a kernel of its own, so its per-user limits are not shared with any other sandbox
// whatever the uid.
func guestUser(user string) string {
	if user == roche.UserAuto {
		return "65534:65534"
	}
	return user
}
