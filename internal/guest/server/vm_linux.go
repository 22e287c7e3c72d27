package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest/vmlink"
)

// vmCgroup is the cgroup, inside a microVM, that every command of the sandbox runs in.
const vmCgroup = "/sys/fs/cgroup/sandbox"

// vmAgentReserve is the memory kept back from the sandbox's cgroup for the agent and the
// guest kernel, so that a program that fills the VM is OOM-killed, not the agent.
const vmAgentReserve = 16 << 20

// IsVMInit reports whether this process is the init of a Roche microVM: the kernel
// started it as /init from the initramfs (in a container the agent has another name).
func IsVMInit() bool { return os.Getpid() == 1 && len(os.Args) > 0 && os.Args[0] == "/init" }

// RunVM is roche-agent as the init of a microVM. What a container engine does for a
// container it does itself: it loads the few kernel modules the guest needs from the
// initramfs, mounts the image's root filesystem read-only (under an overlay on a tmpfs
// when writable), gives it a minimal /dev, /proc, a read-only /sys and a size-capped
// /tmp, puts every command in a cgroup with the PID and memory limits, installs
// no-new-privileges and a seccomp filter that every command inherits, switches root, and
// serves the agent protocol over virtio-serial or vsock. When the agent stops (its
// lifetime, or the host going away) it powers the VM off; the hypervisor then exits.
// It returns only on failure, after printing the reason on the console.
func RunVM() error {
	err := runVM()
	if err != nil {
		fmt.Fprintf(os.Stderr, "roche-agent: vm init: %v\n", err)
	}
	powerOff()
	return err
}

func runVM() error {
	if err := mountEarly(); err != nil {
		return err
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	debug := bytes.Contains(cmdline, []byte(vmlink.DebugParam))
	step := func(what string) {
		if debug {
			fmt.Fprintf(os.Stderr, "roche-agent: vm init: %s\n", what)
		}
	}
	if bytes.Contains(cmdline, []byte(vmlink.ProbeParam)) {
		fmt.Fprintln(os.Stderr, vmlink.ProbeMarker)
		return nil
	}
	b, err := os.ReadFile(vmlink.ConfigPath)
	if err != nil {
		return fmt.Errorf("reading the VM config: %w", err)
	}
	var cfg vmlink.GuestConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("parsing the VM config: %w", err)
	}
	step("loading modules")
	if err := loadModules(string(cmdline)); err != nil {
		return err
	}
	step("mounting the root filesystem")
	if err := mountRoot(cfg); err != nil {
		return err
	}
	step("making the sandbox cgroup")
	cgroup, err := setupCgroup(cfg)
	if err != nil {
		return err
	}
	_ = unix.Sethostname([]byte(cfg.Hostname))
	if err := loopbackUp(); err != nil {
		return err
	}
	hardenKernel()
	// The transport is opened before the root moves: its device node lives in the
	// initramfs's /dev, which the sandbox never sees.
	step("opening the " + cfg.Transport + " transport")
	ln, err := listen(cfg.Transport)
	if err != nil {
		return err
	}
	_ = os.RemoveAll("/lib/modules") // give the initramfs's memory back
	step("switching root")
	if err := switchRoot("/newroot"); err != nil {
		return err
	}
	if cfg.Workdir != "" {
		_ = os.Chdir(cfg.Workdir)
	}
	step("locking down")
	if err := lockDown(); err != nil {
		return err
	}
	step("serving")

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var egressDial func() (net.Conn, error)
	if cfg.EgressListen != "" {
		// The sandbox's HTTP proxy connections go to the host as streams of the agent's
		// own link; the VM has no network device for them to take instead.
		rl, ok := ln.(*relinkListener)
		if !ok {
			return fmt.Errorf("egress is carried over the serial link only, not %s", cfg.Transport)
		}
		egressDial = rl.openToHost
	}
	s, err := New(Config{
		EgressListen: cfg.EgressListen, EgressDial: egressDial,
		User: cfg.User, Lifetime: time.Duration(cfg.LifetimeMS) * time.Millisecond,
		LeaseGrace: time.Duration(cfg.LeaseGraceMS) * time.Millisecond,
		FirstLease: time.Duration(cfg.FirstLeaseMS) * time.Millisecond,
		Log:        log, Listener: ln,
		// The sandbox cgroup holds the commands to the PID limit; RLIMIT_NPROC says so to
		// a program that asks (ulimit -u), and holds the same, the VM's kernel its own.
		NProc: cfg.PidsLimit,
	})
	if err != nil {
		return err
	}
	s.cgroupFD = cgroup
	s.baseEnv = guestEnv(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if rl, ok := ln.(*relinkListener); ok {
		// The host end of the serial line is gone: nobody can reach this VM any more.
		go func() { <-rl.lost; cancel() }()
	}
	return s.Run(ctx)
}

func mountEarly() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mounting %s: %w", m.dst, err)
		}
	}
	return nil
}

// loadModules loads the modules listed in the initramfs in order, passing each the
// parameters the kernel command line gives it ("virtio_mmio.device=..." is how QEMU's
// microvm and Firecracker describe their devices), as modprobe would.
func loadModules(cmdline string) error {
	b, err := os.ReadFile(vmlink.ModulesPath)
	if err != nil {
		return fmt.Errorf("reading the module list: %w", err)
	}
	params := map[string][]string{}
	for _, f := range strings.Fields(cmdline) {
		name, param, ok := strings.Cut(f, ".")
		if ok && strings.Contains(param, "=") {
			name = strings.ReplaceAll(name, "-", "_")
			params[name] = append(params[name], param)
		}
	}
	for _, name := range strings.Fields(string(b)) {
		f, err := os.Open(filepath.Join("/lib/modules", name+".ko"))
		if err != nil {
			return fmt.Errorf("kernel module %s: %w", name, err)
		}
		err = unix.FinitModule(int(f.Fd()), strings.Join(params[strings.ReplaceAll(name, "-", "_")], " "), 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("loading kernel module %s: %w", name, err)
		}
	}
	return nil
}

// waitFor waits for a path the kernel creates as devices appear.
func waitFor(path string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v", path, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mountRoot(cfg vmlink.GuestConfig) error {
	if err := waitFor("/dev/vda", 10*time.Second); err != nil {
		return fmt.Errorf("the root filesystem disk: %w", err)
	}
	_ = os.MkdirAll("/newroot", 0o755)
	// nodev: device nodes in the image are not devices in the sandbox; its /dev is ours.
	const rootFlags = unix.MS_RDONLY | unix.MS_NODEV
	if !cfg.Writable {
		if err := unix.Mount("/dev/vda", "/newroot", "ext4", rootFlags, ""); err != nil {
			return fmt.Errorf("mounting the root filesystem: %w", err)
		}
	} else {
		for _, d := range []string{"/lower", "/rw"} {
			_ = os.MkdirAll(d, 0o755)
		}
		if err := unix.Mount("/dev/vda", "/lower", "ext4", rootFlags, ""); err != nil {
			return fmt.Errorf("mounting the root filesystem: %w", err)
		}
		// The writable layer lives in guest memory: writes vanish with the VM. Its size is
		// the sandbox's disk limit (past it, ENOSPC), and the VM's memory bounds it too.
		opts := "mode=0755"
		if cfg.DiskSize > 0 {
			opts += fmt.Sprintf(",size=%d", cfg.DiskSize)
		}
		if err := unix.Mount("tmpfs", "/rw", "tmpfs", unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mounting the writable layer: %w", err)
		}
		for _, d := range []string{"/rw/upper", "/rw/work"} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
		}
		if err := unix.Mount("overlay", "/newroot", "overlay", unix.MS_NODEV, "lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work"); err != nil {
			return fmt.Errorf("mounting the writable overlay: %w", err)
		}
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp"} {
		if _, err := os.Stat("/newroot/" + d); err != nil {
			return fmt.Errorf("the image has no /%s to mount on (the root filesystem builder adds it): %w", d, err)
		}
	}
	const nsd = unix.MS_NOSUID | unix.MS_NODEV
	mounts := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"proc", "/newroot/proc", "proc", nsd | unix.MS_NOEXEC, ""},
		{"sysfs", "/newroot/sys", "sysfs", nsd | unix.MS_NOEXEC | unix.MS_RDONLY, ""},
		{"cgroup2", "/newroot/sys/fs/cgroup", "cgroup2", nsd | unix.MS_NOEXEC, ""},
		{"tmpfs", "/newroot/dev", "tmpfs", unix.MS_NOSUID, "mode=0755,size=65536k"},
		{"tmpfs", "/newroot/tmp", "tmpfs", nsd, fmt.Sprintf("mode=1777,size=%d", cfg.TmpSize)},
	}
	for _, m := range mounts {
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mounting %s: %w", strings.TrimPrefix(m.dst, "/newroot"), err)
		}
	}
	if err := bindEtc(cfg.Hostname); err != nil {
		return err
	}
	if err := bindTrust(cfg.TrustFiles); err != nil {
		return err
	}
	return populateDev("/newroot/dev", cfg.TmpSize)
}

// bindEtc covers the image's /etc/hosts and /etc/hostname with the VM's own, read-only,
// as a container engine does: the root filesystem is shared by every VM of the image,
// and a program that looks up its own host name must find it.
func bindEtc(hostname string) error {
	files := map[string]string{
		"hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + hostname + "\n",
		"hostname": hostname + "\n",
	}
	for name, content := range files {
		target := "/newroot/etc/" + name
		if fi, err := os.Lstat(target); err != nil || !fi.Mode().IsRegular() {
			continue // nothing to cover, and a read-only root cannot gain a file
		}
		src := "/roche/" + name
		if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
			return err
		}
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mounting /etc/%s: %w", name, err)
		}
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("making /etc/%s read-only: %w", name, err)
		}
	}
	return nil
}

// bindTrust covers each trust file's path in the new root with its content, read-only,
// as a container engine binds the egress CA's files. The root filesystem builder makes
// the paths egress.Trust uses (prepareTree in provider/vm); the agent follows no link
// of the image's, whose target it would resolve in the initramfs.
func bindTrust(files []vmlink.TrustFile) error {
	for i, f := range files {
		if !filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path {
			return fmt.Errorf("trust file path %q is not absolute and clean", f.Path)
		}
		target := "/newroot" + f.Path
		// Every component of the path, the file too, must be what it says, not a link.
		for p := f.Path; p != "/"; p = filepath.Dir(p) {
			fi, err := os.Lstat("/newroot" + p)
			if err != nil {
				return fmt.Errorf("the image has no %s to install the egress CA at: %w", f.Path, err)
			}
			if fi.Mode()&os.ModeSymlink != 0 {
				return fmt.Errorf("cannot install the egress CA at %s: %s is a symbolic link in the image", f.Path, p)
			}
			if p == f.Path && !fi.Mode().IsRegular() {
				return fmt.Errorf("cannot install the egress CA at %s: not a regular file in the image", f.Path)
			}
		}
		src := fmt.Sprintf("/roche/trust-%d", i)
		if err := os.WriteFile(src, f.Content, 0o644); err != nil {
			return err
		}
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mounting %s: %w", f.Path, err)
		}
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", f.Path, err)
		}
	}
	return nil
}

// populateDev makes the /dev a container gets: the harmless character devices, a private
// devpts and a /dev/shm tmpfs of shmSize bytes, and nothing that reaches the disks or the
// agent's port.
func populateDev(dev string, shmSize int64) error {
	for _, n := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		p := filepath.Join(dev, n.name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("making /dev/%s: %w", n.name, err)
		}
		_ = os.Chmod(p, 0o666) // the umask applied to mknod
	}
	for link, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx",
	} {
		if err := os.Symlink(target, filepath.Join(dev, link)); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(filepath.Join(dev, d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", filepath.Join(dev, "pts"), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mounting /dev/pts: %w", err)
	}
	if err := unix.Mount("shm", filepath.Join(dev, "shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, fmt.Sprintf("mode=1777,size=%d", shmSize)); err != nil {
		return fmt.Errorf("mounting /dev/shm: %w", err)
	}
	return nil
}

// setupCgroup makes the sandbox's cgroup: pids.max is the PID limit, memory.max all of
// the VM's memory but a reserve for the agent; it returns the cgroup's directory fd, in
// which commands are started.
func setupCgroup(cfg vmlink.GuestConfig) (int, error) {
	root := "/newroot/sys/fs/cgroup"
	// cpu as well, so the sandbox as a whole shares the CPU with the agent, which must
	// still be able to kill a fork bomb at its timeout.
	for _, c := range []string{"+pids", "+memory", "+cpu"} {
		if err := os.WriteFile(root+"/cgroup.subtree_control", []byte(c), 0); err != nil && c != "+cpu" {
			return -1, fmt.Errorf("enabling the %s cgroup controller: %w", c[1:], err)
		}
	}
	dir := root + "/" + filepath.Base(vmCgroup)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return -1, fmt.Errorf("making the sandbox cgroup: %w", err)
	}
	if err := os.WriteFile(dir+"/pids.max", []byte(strconv.Itoa(cfg.PidsLimit)), 0); err != nil {
		return -1, fmt.Errorf("setting the PID limit: %w", err)
	}
	if total := memTotal(); total > 2*vmAgentReserve {
		if err := os.WriteFile(dir+"/memory.max", []byte(strconv.FormatInt(total-vmAgentReserve, 10)), 0); err != nil {
			return -1, fmt.Errorf("setting the memory limit: %w", err)
		}
	}
	_ = os.WriteFile(dir+"/memory.swap.max", []byte("0"), 0)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening the sandbox cgroup: %w", err)
	}
	return fd, nil
}

func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// loopbackUp brings up lo, the only interface a sandbox without network has.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	return nil
}

// hardenKernel closes kernel interfaces an unprivileged program could attack, as a
// container's host usually has: new user namespaces (the way to regain capabilities
// over fresh namespaces), unprivileged BPF and userfaultfd, kernel logs and pointers.
// It also lets allocations overcommit, as on a container's roomy host: a program that
// asks for more than the VM has then meets the sandbox's memory limit (an OOM kill,
// reported) rather than a refusal the size of the whole small VM.
func hardenKernel() {
	for k, v := range map[string]string{
		"vm/overcommit_memory":             "1",
		"user/max_user_namespaces":         "0",
		"kernel/unprivileged_bpf_disabled": "1",
		"vm/unprivileged_userfaultfd":      "0",
		"kernel/dmesg_restrict":            "1",
		"kernel/kptr_restrict":             "2",
		"kernel/perf_event_paranoid":       "3",
	} {
		_ = os.WriteFile("/proc/sys/"+k, []byte(v), 0)
	}
}

// listen opens the agent's transport.
func listen(transport string) (net.Listener, error) {
	switch transport {
	case vmlink.TransportVsock:
		return listenVsock(vmlink.VsockPort)
	case vmlink.TransportSerial, "":
		port, err := openSerialPort(vmlink.SerialPortName)
		if err != nil {
			return nil, err
		}
		ln, err := newRelinkListener(port)
		if err != nil {
			port.Close()
			return nil, err
		}
		return ln, nil
	}
	return nil, fmt.Errorf("unknown transport %q", transport)
}

// openSerialPort finds the virtio-serial port by name (udev would make
// /dev/virtio-ports/NAME; there is no udev here).
func openSerialPort(name string) (*os.File, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, _ := os.ReadDir("/sys/class/virtio-ports")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", e.Name(), "name"))
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + e.Name()
				if err := waitFor(dev, 5*time.Second); err != nil {
					return nil, err
				}
				return os.OpenFile(dev, os.O_RDWR|syscall.O_CLOEXEC, 0)
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no virtio-serial port named %s: the VM was started without it", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// switchRoot makes dir the root, as switch_root does for an initramfs (pivot_root does
// not work on the initramfs's rootfs).
func switchRoot(dir string) error {
	if err := os.Chdir(dir); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("changing root: %w", err)
	}
	return os.Chdir("/")
}

// lockDown sets no-new-privileges and installs the seccomp filter on every thread of the
// agent; each command inherits both.
func lockDown() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no-new-privileges: %w", err)
	}
	return installSeccomp()
}

// guestEnv is every command's base environment: the configured one, with PATH, HOME and
// HOSTNAME filled in as a container engine does when the image leaves them out.
func guestEnv(cfg vmlink.GuestConfig) []string {
	env := append([]string(nil), cfg.Env...)
	has := func(k string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	}
	if !has("PATH") {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	if !has("HOSTNAME") {
		env = append(env, "HOSTNAME="+cfg.Hostname)
	}
	// HOME is somewhere the sandbox user can write, as in a Docker sandbox: the image's
	// passwd gives nobody /nonexistent, and the root filesystem is read-only.
	if !has("HOME") {
		env = append(env, "HOME=/tmp")
	}
	return env
}

// powerOff ends the VM: with reboot=t (QEMU) or reboot=k (Firecracker) on the kernel
// command line and the hypervisor told not to reboot, a restart makes it exit.
func powerOff() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	// Still here (not PID 1): nothing else to do.
}
