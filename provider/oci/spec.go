package oci

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
)

// specVersion is the runtime-spec version config.json claims: the oldest that has all
// it uses, as older runtimes (Debian's crun 1.8.1) refuse newer ones they do not know.
const specVersion = "1.0.2"

// agentCaps are the capabilities roche-agent, PID 1, starts with (agentspec.Caps), as
// the runtime spec names them.
var agentCaps = func() []string {
	caps := make([]string, len(agentspec.Caps))
	for i, c := range agentspec.Caps {
		caps[i] = "CAP_" + c
	}
	return caps
}()

// Docker's masked and read-only paths (moby oci.DefaultSpec): kernel information and
// knobs a container has no business reading or writing.
var (
	maskedPaths = []string{
		"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// pidsCgroupPaths are where a sandbox sees its pids cgroup: the controller's directory
// (cgroup v1) or its files (v2), masked. The cgroup is only the host's ceiling on the
// whole sandbox, the agent's threads included; the limit that holds, and that a program
// reads, is the agent's RLIMIT_NPROC (agent --nproc), as in the docker provider.
var pidsCgroupPaths = []string{
	"/sys/fs/cgroup/pids",
	"/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids.current", "/sys/fs/cgroup/pids.events", "/sys/fs/cgroup/pids.peak",
}

// cgroupReadonly are paths made read-only over the runtime's cgroup mount, after
// readonlyPaths: /sys/fs/cgroup itself, which on a cgroup v1 host is a tmpfs holding
// the controllers that crun makes mode 1777 and leaves writable (runc's is mode 555),
// then each controller below it again, as crun's read-only bind of the tmpfs carries
// its read-only controllers along writable (root in the sandbox could raise pids.max).
var cgroupReadonly = sync.OnceValue(func() []string {
	return append([]string{"/sys/fs/cgroup"}, cgroupControllers()...)
})

// bundleSpec is what a sandbox's config.json is made from.
type bundleSpec struct {
	id       string
	cfg      roche.Config
	image    imageRoot
	rootfs   string // the mounted overlay
	runDir   string // the agent's socket directory on the host
	agent    string // the roche-agent binary on the host
	user     string // "uid:gid" or the caller's user
	cgroup   string
	lifetime int // seconds
	// lease, for a leased sandbox, is its create's deadline (agentspec.Spec.Lease).
	lease time.Duration
	// connFD, for a one-shot sandbox, is the descriptor of its agent's one connection
	// (agentspec.Spec.ConnFD), which it serves instead of a socket.
	connFD int
	// compiledSeccomp is the runtime's own compilation of the seccomp filter, base64, to
	// hand it (crunSeccompBPF); empty to let it compile config.json's.
	compiledSeccomp string
	// trust is what the sandbox's egress proxy gives it (an allowlist with an https://
	// entry or secrets): its CA in the trust paths, bound read-only, and the variables
	// naming them and holding the secrets' placeholders.
	trust egress.Trust
}

// spec builds the sandbox's OCI runtime config: every namespace new (pid, mount, ipc,
// uts, cgroup, network with only lo), roche-agent as PID 1 with the few capabilities it
// needs and no new privileges, Roche's seccomp profile, Docker's masked and read-only
// paths, cgroup limits for memory (no swap), pids (a ceiling; the agent holds the
// sandbox's programs to exactly the limit) and cpu, and roche.DefaultOpenFiles open
// files per process.
func (b bundleSpec) spec() (*specs.Spec, error) {
	filter, err := seccompFilter()
	if err != nil {
		return nil, err
	}
	cfg := b.cfg
	env := append([]string{}, b.image.Env...)
	if !hasEnv(env, "PATH") {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	for k, v := range cfg.Env {
		env = append(env, k+"="+v)
	}
	// HOME is somewhere the sandbox user can write, as in Docker sandboxes.
	if _, set := cfg.Env["HOME"]; !set {
		env = append(env, "HOME=/tmp")
	}
	agent := agentspec.Spec{
		Socket: agentspec.RunDir + "/" + agentspec.SocketName, ConnFD: b.connFD, Owner: os.Geteuid(), User: b.user,
		Lifetime: time.Duration(b.lifetime) * time.Second,
		// Exactly the limit, for the sandbox user's processes and threads (RLIMIT_NPROC,
		// which the agent, root, is exempt from): what a program reads is what holds.
		NProc: cfg.PidsLimit,
		Lease: b.lease,
	}
	if len(cfg.NetworkAllowlist) > 0 {
		agent.EgressSocket = agentspec.RunDir + "/" + agentspec.EgressSocketName
		env = append(env, egress.SandboxEnv()...)
		env = append(env, b.trust.Env...)
	}
	args := append([]string{agentspec.Binary}, agent.Args()...)
	cwd := cfg.Workdir
	if cwd == "" {
		cwd = "/"
	}
	mem := cfg.MemoryBytes()
	// The host's ceiling on the whole sandbox: the limit, and the agent's threads.
	pids := int64(cfg.PidsLimit + guest.ThreadCeiling)
	period := uint64(100_000)
	quota := int64(cfg.CPUs * float64(period))
	swappiness := uint64(0)
	tmpSize := strconv.FormatInt(cfg.TmpSize(), 10)
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=" + tmpSize}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=" + tmpSize}},
		{Destination: agentspec.Binary, Type: "bind", Source: b.agent, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		{Destination: agentspec.RunDir, Type: "bind", Source: b.runDir, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
	}
	for _, f := range b.trust.Files {
		mounts = append(mounts, specs.Mount{Destination: f.Sandbox, Type: "bind", Source: f.Host,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec", "rprivate"}})
	}
	for _, m := range cfg.Mounts {
		mode := "ro"
		if m.ReadWrite {
			mode = "rw"
		}
		mounts = append(mounts, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source,
			Options: []string{"rbind", mode, "nosuid", "nodev", "rprivate"}})
	}
	var annotations map[string]string
	if b.compiledSeccomp != "" {
		annotations = map[string]string{crunSeccompBPF: b.compiledSeccomp}
	}
	return &specs.Spec{
		Version:     specVersion,
		Annotations: annotations,
		Hostname:    b.id,
		Root:        &specs.Root{Path: b.rootfs, Readonly: !cfg.Writable},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: args, Env: env, Cwd: cwd,
			Capabilities: &specs.LinuxCapabilities{
				Bounding: agentCaps, Effective: agentCaps, Permitted: agentCaps,
			},
			// The open files of every process, soft and hard, from the agent on (which sets
			// the same, agent.OpenFiles): with the process limit they bound what one
			// sandbox holds of the host's file table. The per-user kernel limits (inotify
			// and the like) are the uid's, each sandbox having its own.
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: roche.DefaultOpenFiles, Soft: roche.DefaultOpenFiles}},
			NoNewPrivileges: true,
			OOMScoreAdj:     intPtr(0),
		},
		Mounts: mounts,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
			},
			CgroupsPath: b.cgroup,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &mem, Swap: &mem, Swappiness: &swappiness},
				Pids:    &specs.LinuxPids{Limit: pids},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
			},
			Seccomp:           filter,
			MaskedPaths:       append(slices.Clip(maskedPaths), pidsCgroupPaths...),
			ReadonlyPaths:     append(slices.Clip(readonlyPaths), cgroupReadonly()...),
			RootfsPropagation: "rprivate",
		},
	}, nil
}

func hasEnv(env []string, k string) bool {
	for _, kv := range env {
		if len(kv) > len(k) && kv[:len(k)+1] == k+"=" {
			return true
		}
	}
	return false
}

func intPtr(i int) *int { return &i }

// mountPoints are the paths below the root that the runtime mounts on, which must exist
// in the image's tree or be made (stubs) in a layer above it: a read-only root cannot
// take new directories.
func (b bundleSpec) mountPoints() []mountPoint {
	mp := []mountPoint{
		{"/proc", true}, {"/dev", true}, {"/sys", true}, {"/tmp", true},
		{filepath.Dir(agentspec.Binary), true}, {agentspec.Binary, false}, {agentspec.RunDir, true},
	}
	if b.cfg.Workdir != "" {
		// The runtime starts the agent there; one the image lacks is made, as Docker does.
		mp = append(mp, mountPoint{b.cfg.Workdir, true})
	}
	for _, f := range b.trust.Files {
		mp = append(mp, mountPoint{f.Sandbox, false})
	}
	for _, m := range b.cfg.Mounts {
		fi, err := os.Stat(m.Source)
		mp = append(mp, mountPoint{m.Target, err != nil || fi.IsDir()})
	}
	return mp
}

type mountPoint struct {
	path string
	dir  bool
}
