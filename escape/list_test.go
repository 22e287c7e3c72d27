package escape

// The cases, in the table's order. Guards name the answer each attempt got and what
// gave it; see judge.

var (
	seccomp    = g("Roche's seccomp profile", "EPERM")
	noCaps     = g("no capabilities", "EPERM")
	procCheck  = g("the kernel's ptrace access check on another user's process", "EACCES", "EPERM")
	roRoot     = g("read-only root", "EROFS")
	notOwner   = g("file permissions (not the sandbox user's)", "EACCES")
	notThere   = g("absent from the sandbox", "ENOENT", "none")
	busyText   = g("a running binary cannot be opened for writing", "ETXTBSY")
	roProc     = g("/proc/sys read-only", "EROFS")
	masked     = g("masked (absent)", "ENOENT")
	noRoute    = g("no route: only lo", "ENETUNREACH", "EHOSTUNREACH", "none")
	ownLo      = g("a loopback of its own", "ECONNREFUSED", "none")
	ownNS      = g("namespaces of its own", "none", "ENOENT", "ECONNREFUSED")
	untouched  = g("the victim untouched", "untouched")
	kernelOwn  = g("a kernel of its own (its own per-user limits)", "cap", "ENOSPC", "EMFILE")
	noGuestLnk = g("the guest cannot make links", "nolink EPERM", "nolink ENOTSUP", "nolink ENOSYS")
)

var noSyscalls = map[string]string{cWasm: "WASI has no such system call (no ctypes, no raw syscalls)"}

var cases = []escapeCase{
	{
		id:     "CVE-2019-5736",
		title:  "overwrite the runtime's binary: open /proc/self/exe, /proc/1/exe (the agent), the parent's exe, /proc/1/exe reopened from an O_PATH descriptor, and the agent's binary by path, each for writing",
		keys:   []string{"exe.self", "exe.pid1", "exe.pid1.reopen", "exe.parent", "exe.agent.path"},
		guards: on("*", procCheck.only("exe.pid1", "exe.pid1.reopen", "exe.parent"), roRoot, notOwner, notThere, busyText),
		na:     map[string]string{cWasm: "no /proc and no binary of its own: the interpreter is a module in the host process"},
	},
	{
		id:    "CVE-2024-21626",
		title: "leaked host descriptors: anything beyond stdio in /proc/self/fd, /proc/1/fd (the agent's), chdir to /proc/self/fd/N, and a command started with the workdir /proc/self/fd/N (N = 3..9)",
		keys:  []string{"fd.self", "fd.pid1", "fd.chdir", "fd.workdir"},
		na:    map[string]string{cWasm: "no /proc, and nothing inherited from a runtime: the guest's files are opened by the host process"},
		guards: on("*", g("the agent starts commands with stdio only", "none").only("fd.self"), procCheck.only("fd.pid1"),
			g("no such descriptor in the new process", "ENOENT", "EBADF").only("fd.chdir", "fd.workdir"),
			g("descriptors 3-9 of the new process are not directories", "ENOTDIR").only("fd.chdir", "fd.workdir"),
			g("the agent refuses a workdir in /proc", "refused: invalid config").only("fd.workdir")),
	},
	{
		id:     "CVE-2022-0492",
		title:  "cgroup v1 release_agent: mount cgroupfs, the same after unsharing user, mount and cgroup namespaces, open release_agent and notify_on_release for writing, create a file and a directory in /sys/fs/cgroup",
		keys:   []string{"cgroup.mount", "cgroup.userns", "cgroup.release_agent", "cgroup.create", "cgroup.mkdir"},
		guards: on("*", seccomp, roRoot, notOwner, notThere),
		na:     noSyscalls,
	},
	{id: "mount", title: "mount a tmpfs, bind-mount /, remount / read-write", keys: []string{"mount.tmpfs", "mount.bind", "mount.remount"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "user namespace", title: "unshare a user and mount namespace, then mount inside it; setns into PID 1's mount namespace", keys: []string{"userns.unshare", "userns.setns"}, guards: on("*", seccomp, procCheck, notThere.only("userns.setns")), na: noSyscalls},
	{id: "ptrace", title: "PTRACE_ATTACH to a child of its own (which the kernel allows any process), PTRACE_ATTACH and PTRACE_SEIZE to PID 1 (the agent)", keys: []string{"ptrace.child", "ptrace.attach", "ptrace.seize"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "modify_ldt", title: "modify_ldt (x86): read the local descriptor table", keys: []string{"modify_ldt"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "process_vm_readv", title: "read PID 1's memory with process_vm_readv", keys: []string{"process_vm.pid1"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "bpf", title: "bpf(BPF_MAP_CREATE)", keys: []string{"bpf"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "perf_event_open", title: "perf_event_open of a software counter on itself (allowed to any user by perf_event_paranoid 2)", keys: []string{"perf_event_open"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "userfaultfd", title: "userfaultfd()", keys: []string{"userfaultfd"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "keyctl", title: "keyctl(JOIN_SESSION_KEYRING) and add_key", keys: []string{"keyctl", "add_key"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "io_uring", title: "io_uring_setup", keys: []string{"io_uring_setup"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "kernel module", title: "init_module and finit_module", keys: []string{"init_module", "finit_module"}, guards: on("*", seccomp), na: noSyscalls},
	{id: "mknod", title: "mknod a character device (1,3) and a block device (7,0) in /tmp", keys: []string{"mknod.char", "mknod.block"}, guards: on("*", noCaps), na: map[string]string{cWasm: "WASI has no mknod"}},
	{id: "/proc/sys", title: "open /proc/sys/vm/drop_caches and /proc/sys/kernel/modprobe for writing", keys: []string{"procsys.drop_caches", "procsys.modprobe"}, guards: on("*", roProc, notOwner, masked), na: map[string]string{cWasm: "no /proc"}},
	{id: "sysrq", title: "open /proc/sysrq-trigger for writing", keys: []string{"procsys.sysrq"}, guards: on("*", roProc, notOwner, masked), na: map[string]string{cWasm: "no /proc"}},
	{id: "core_pattern", title: "open /proc/sys/kernel/core_pattern for writing", keys: []string{"procsys.core_pattern"}, guards: on("*", roProc, notOwner, masked), na: map[string]string{cWasm: "no /proc"}},
	{id: "raw sockets", title: "an AF_INET and an AF_INET6 raw socket", keys: []string{"socket.raw", "socket.raw6"}, guards: on("*", noCaps), na: map[string]string{cWasm: "WASI has no raw sockets"}},
	{id: "packet sockets", title: "an AF_PACKET socket", keys: []string{"socket.packet"}, guards: on("*", noCaps), na: map[string]string{cWasm: "WASI has no packet sockets"}},
	{id: "vsock", title: "make an AF_VSOCK socket (a microVM's agent may listen on vsock); never connected, since a connect may leave a machine that is itself a guest", keys: []string{"socket.vsock"}, guards: on("*", seccomp), na: map[string]string{cWasm: "WASI has no vsock", cQEMU: "no vsock device in the guest: its agent is on the serial line (Firecracker's listens on vsock)"}},
	{
		id:     "engine from inside",
		title:  "the engines' sockets and state by their usual paths (docker.sock, containerd, runc, crun, runsc, Roche's state, the kubelet's), TCP to every port the host listens on at 127.0.0.1, a route to the cluster's API server and kubelet",
		keys:   []string{"engine.paths", "net.host_loopback", "net.cluster"},
		guards: on("*", notThere, ownLo, noRoute),
		na:     map[string]string{cWasm: "no sockets"},
	},
	{
		id:     "agent from inside",
		title:  "connect to the agent's socket, list its directory, signal (signal 0) every process not the sandbox user's",
		keys:   []string{"agent.connect", "agent.listdir", "signal.others"},
		guards: on("*", notOwner, g("another user's process", "EPERM", "none")),
		na:     map[string]string{cQEMU: "the agent is the guest's init, reached over the serial line or vsock, not a socket file", cWasm: "the agent is the host process; no processes to signal"},
	},
	{
		id:     "PID 1's secrets",
		title:  "read PID 1's environ, maps, auxv, mem, stack, syscall; list its root and cwd",
		keys:   []string{"pid1.environ", "pid1.maps", "pid1.auxv", "pid1.mem", "pid1.stack", "pid1.syscall", "pid1.root", "pid1.cwd"},
		guards: on("*", procCheck, notThere),
		na:     map[string]string{cWasm: "no /proc"},
	},
	{
		id:     "control sockets from a local user",
		title:  "as uid 65534 on the host: connect to the engine's sockets and to every unix socket file of the suite's sandboxes (agents, supervisors), and to every abstract socket that appeared in the host's network namespace meanwhile",
		keys:   []string{"host.sockets", "host.abstract"},
		guards: on("*", notOwner, g("no abstract socket in the host's namespace", "none")),
	},
	{
		id:     "cluster credentials from a local user",
		title:  "as uid 65534 on the host: read the kubeconfig and token the provider drives the cluster with",
		keys:   []string{"host.credentials"},
		guards: on("*", notOwner),
		na:     map[string]string{cDocker: "no cluster", cRunsc: "no cluster", cCrun: "no cluster", cRunc: "no cluster", cQEMU: "no cluster", cWasm: "no cluster"},
	},
	{id: "neighbour's processes", title: "a second sandbox looks for the first's process (its argv) in /proc", keys: []string{"neighbour.proc"}, guards: on("*", ownNS), na: map[string]string{cWasm: "no /proc, no processes"}},
	{id: "neighbour's files", title: "a second sandbox stats the first's files in /tmp and /dev/shm", keys: []string{"neighbour.tmp", "neighbour.shm"}, guards: on("*", ownNS)},
	{id: "neighbour's IPC", title: "a second sandbox opens the first's System V segment by key and connects to its abstract unix socket", keys: []string{"neighbour.sysv", "neighbour.abstract"}, guards: on("*", ownNS), na: map[string]string{cWasm: "WASI has no System V IPC or unix sockets"}},
	{id: "metadata", title: "a route to the cloud metadata addresses (169.254.169.254 and the rest of docs/network.md's list, IPv4 and IPv6)", keys: []string{"net.metadata"}, guards: on("*", noRoute, g("no IPv6", "EADDRNOTAVAIL", "EAFNOSUPPORT")), na: map[string]string{cWasm: "WASI has no sockets"}},
	{id: "host address", title: "a route to each of the host's own addresses; interfaces and routes other than lo", keys: []string{"net.host", "net.routes"}, guards: on("*", noRoute, notThere), na: map[string]string{cWasm: "WASI has no sockets"}},
	{id: "writable outside scratch", title: "every path the sandbox user may write outside /tmp, /dev/shm and HOME (a host file such as a termination log, a cgroup tmpfs)", keys: []string{"writable.outside"}, guards: on("*", g("read-only root, no world-writable files", "none"))},
	{
		id:     "device node on scratch",
		title:  "mknod a character device (/dev/null's numbers) in /tmp and in /dev/shm, which lack nodev on Kubernetes (the kubelet cannot mount an emptyDir nodev); where both are mounted nodev, that is said too (on gVisor, whose mountinfo never shows nodev, a node in its tmpfs would open one of its own emulated devices)",
		keys:   []string{"scratch.device"},
		guards: on("*", g("no CAP_MKNOD (no capabilities)", "EPERM"), g("mounted nodev", "nodev")),
		na:     map[string]string{cWasm: "no mounts, devices or set-uid: the guest's directories are host directories"},
	},
	{
		id:    "set-user-ID file on scratch",
		title: "make a set-user-ID root file in /tmp and in /dev/shm (chmod 6755, chown to root), and run a set-user-ID root program of the image (su) to see whether it gets root's effective uid, as such a file on scratch would; where both mounts are nosuid, that is said too (Kubernetes cannot mount an emptyDir nosuid)",
		keys:  []string{"scratch.setuid"},
		guards: on("*", g("no CAP_CHOWN (the file stays the sandbox user's)", "EPERM"),
			g("no_new_privs (su ran with the sandbox user's uid)", "no_new_privs"), g("mounted nosuid", "nosuid")),
		na: map[string]string{cWasm: "no mounts, devices or set-uid: the guest's directories are host directories"},
	},
	{id: "PID limit as promised", title: "the PID limit a program reads (the pids cgroup's pids.max where visible, else RLIMIT_NPROC) is the config's, 64", keys: []string{"pids.promise"}, guards: on("*", g("pids.max 64", "pids.max"), g("RLIMIT_NPROC 64 (the cgroup only the host's ceiling)", "nproc")), na: map[string]string{cWasm: "no processes"}},
	{id: "copy-out race", title: "roche cp out of a directory whose file keeps turning into a symlink to a host victim and a hard link, and whose subdirectory into a symlink to the victim's directory (30 copies, more until one catches the plain file)", keys: []string{"race.copyout"}, guards: on("*", untouched, noGuestLnk)},
	{id: "copy-in race", title: "roche cp in of a host directory mounted read-write while the sandbox swaps a file in it for a symlink to a root-only host file (providertest's CopyInRace)", keys: []string{"race.copyin"}, guards: on("*", untouched, g("the guest cannot make links", "nolink")), na: map[string]string{cK8s: "no host mounts", cQEMU: "no host mounts"}},
	{id: "files API race", title: "the files API (write, mkdir, rename, remove) on paths that keep turning into links to a root-owned host directory mounted read-write", keys: []string{"race.files"}, guards: on("*", untouched, noGuestLnk), na: map[string]string{cK8s: "no host mounts", cQEMU: "no host mounts"}},
	{id: "workspace and snapshot race", title: "a sandbox keeps swapping links to a host victim in its workspace while the host snapshots it, then destroys it and removes the workspace", keys: []string{"race.persist"}, guards: on("*", untouched, noGuestLnk), na: map[string]string{cCrun: "no workspaces or snapshots", cRunc: "no workspaces or snapshots", cK8s: "no workspaces or snapshots", cQEMU: "no workspaces or snapshots"}},
	{id: "pids exhaustion", title: "the first sandbox forks until refused and holds them; the second still forks", keys: []string{"exhaust.pids"}, guards: on("*", g("a pids limit of its own", "EAGAIN")).and(cRunsc, g("gVisor's limits refuse the forks or end the hog's own sandbox", "contained")), na: map[string]string{cWasm: "WASI has no fork"}},
	{id: "open files exhaustion", title: "the first sandbox opens files until refused (at most 200,000) and holds them; the second still opens 200; one process may not hold more than 65,536, and where a guest's files are the provider process's own (wasm), that process gains at most 2,048 descriptors meanwhile", keys: []string{"exhaust.nofile"}, guards: on("*", g("RLIMIT_NOFILE", "EMFILE")).and(cRunsc+","+cQEMU, g("RLIMIT_NOFILE", "EMFILE"), kernelOwn).and(cWasm, g("the sandbox's cap of 1024 open files in the provider's process", "EMFILE"))},
	{id: "inode exhaustion", title: "the first sandbox makes empty files in /tmp until refused (at most 100,000); the second still makes 200", keys: []string{"exhaust.inodes"}, guards: on("*", g("a /tmp of its own", "ENOSPC", "cap")).and(cWasm, g("an entry quota on the host directory behind /tmp (65,536)", "ENOSPC"))},
	{id: "inotify exhaustion", title: "the first sandbox takes inotify instances until refused and holds them; the second still gets one", keys: []string{"exhaust.inotify"}, guards: on("*", g("a uid of its own (per-user limits)", "EMFILE")).and(cRunsc+","+cQEMU, kernelOwn, g("RLIMIT_NOFILE", "EMFILE")), na: noSyscalls},
	{id: "inotify watch exhaustion", title: "the first sandbox adds inotify watches until refused and holds them; the second still adds 50", keys: []string{"exhaust.inotify_watches"}, guards: on("*", g("a uid of its own (per-user limits)", "ENOSPC")).and(cRunsc+","+cQEMU, kernelOwn), na: noSyscalls},
	{id: "/dev/shm exhaustion", title: "the first sandbox fills /dev/shm until refused; the second still writes 1 MiB there", keys: []string{"exhaust.shm"}, guards: on("*", g("a /dev/shm of its own", "ENOSPC")), na: map[string]string{cWasm: "no /dev/shm"}},
}

// knownHoles are the cases that get through today, each with what was seen, until
// the fix lands (the run fails when one is blocked: then take it off).
var knownHoles = []hole{}
