package roche

import (
	"fmt"
	"math"
	"path"
	"strings"

	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/size"
)

// Secure defaults, one per row of the defaults table in docs/security.md.
const (
	DefaultImage       = "python:3.12-slim"
	DefaultTimeoutSecs = 300
	DefaultMemory      = "512m"
	DefaultCPUs        = 1.0
	DefaultPidsLimit   = 64
	DefaultUser        = UserAuto
	DefaultTmpSize     = 64 << 20
	DefaultOutputLimit = 10 << 20
	// DefaultDisk bounds what a writable root may hold; DefaultWorkspaceSize is the size
	// a workspace is made with when the config gives none.
	DefaultDisk          = "1g"
	DefaultWorkspaceSize = "1g"
	// DefaultOpenFiles is the open-file limit (RLIMIT_NOFILE, soft and hard) of every
	// process in a sandbox: with the PID limit it bounds the files a sandbox holds open
	// on the host (64 x 1024), whose kernel limit all sandboxes share. It is not a
	// Config field: roche-agent sets it (agent.OpenFiles) in every provider that runs it.
	DefaultOpenFiles = 1024
)

// Bounds of a disk or workspace size: below MinDisk a filesystem has no room for its own
// bookkeeping; MaxDisk is far beyond what a sandbox needs and keeps sizes sane.
const (
	MinDisk = 8 << 20
	MaxDisk = 1 << 40
)

// UserAuto, as Config.User, gives the sandbox a non-root uid of its own: per-user kernel
// limits (inotify instances, processes, locked memory, ...) are then not shared with
// other sandboxes. Each provider says how it chooses it (Docker: from a range it
// allocates; a microVM: any, its kernel is its own).
const UserAuto = "auto"

// Config describes the sandbox to create. Start from DefaultConfig and override fields:
// a zero Config is not valid, so forgetting a field fails loudly instead of silently
// weakening the sandbox.
type Config struct {
	// Image is the container image (Docker, microVM rootfs) or runtime (wasm) to run.
	Image string `json:"image"`
	// Network gives the sandbox a network interface besides lo. Off by default.
	Network bool `json:"network"`
	// NetworkAllowlist lets the sandbox reach these hosts, and only these, over HTTP(S)
	// through a proxy outside it, while it still has no interface but lo: "pypi.org",
	// "*.npmjs.org", "example.com:8443", or an IP literal (the only way to allow a private
	// address). Inside, HTTP_PROXY and HTTPS_PROXY point at it.
	//
	// An entry "[METHOD[,METHOD...] ]https://HOST[:PORT][/PATH-PREFIX]" is intercepted:
	// the proxy terminates TLS to HOST with a CA made for the sandbox (whose certificate
	// the sandbox then trusts) and allows only requests of those methods under that path.
	NetworkAllowlist []string `json:"network_allowlist,omitempty"`
	// Secrets are credentials the egress proxy brokers: the sandbox's environment
	// variable of each name holds a placeholder, which the proxy replaces by the value in
	// the headers of requests to the secret's hosts only (needs a NetworkAllowlist
	// allowing them).
	Secrets []Secret `json:"secrets,omitempty"`
	// EgressLearn is learn mode: the egress proxy allows only what NetworkAllowlist
	// allows (roched gives a sandbox without one a proxy that allows nothing), and roched
	// keeps every allowlist entry its refusals needed, for roche egress suggest. Needs
	// roched.
	EgressLearn bool `json:"egress_learn,omitempty"`
	// Writable mounts the root filesystem read-write. Read-only by default.
	Writable bool `json:"writable"`
	// Disk bounds what a writable root may hold, e.g. "1g" (the default) or "100m":
	// past it writes fail with ENOSPC. The host enforces it (see each provider). "0" is
	// no limit, which a caller must ask for. A read-only root has nothing to bound.
	Disk string `json:"disk"`
	// TimeoutSecs is the sandbox's lifetime: after it the sandbox is destroyed.
	TimeoutSecs int `json:"timeout_secs"`
	// Memory is the memory limit, e.g. "512m", "1g" or a byte count; swap is never added.
	// Memory, Disk and WorkspaceSize are sizes: a number (a fraction allowed) and an
	// optional binary unit k, m, g or t, case-insensitive, with or without a space and a
	// trailing "b" or "ib": "512m", "1.5g", "64 MiB", "4096".
	Memory string `json:"memory"`
	// CPUs is the number of CPUs the sandbox may use, e.g. 0.5 or 2.
	CPUs float64 `json:"cpus"`
	// PidsLimit caps the number of processes and threads.
	PidsLimit int `json:"pids_limit"`
	// Env is set for every command run in the sandbox.
	Env map[string]string `json:"env,omitempty"`
	// Mounts bind host paths into the sandbox, read-only unless ReadWrite.
	Mounts []Mount `json:"mounts,omitempty"`
	// Workdir is the working directory of commands; empty means the image's.
	Workdir string `json:"workdir,omitempty"`
	// User is "uid[:gid]" (or a name the image knows) commands run as, or UserAuto (the
	// default): a non-root uid of the sandbox's own.
	User string `json:"user"`
	// Workspace names a persistent workspace mounted read-write at /workspace, even on a
	// read-only root. It outlives the sandbox: a later sandbox with the same name sees
	// its files. Empty means none.
	Workspace string `json:"workspace,omitempty"`
	// WorkspaceSize is the size of Workspace, e.g. "1g", fixed when the workspace is
	// made: empty means DefaultWorkspaceSize for a new workspace and whatever size an
	// existing one has; a size that differs from an existing workspace's is refused.
	WorkspaceSize string `json:"workspace_size,omitempty"`
	// FromSnapshot creates the sandbox from a snapshot (see Snapshotter) instead of
	// Image: its files as they were, without its processes.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// Metadata is the caller's key/value labels, kept with the sandbox and returned as
	// SandboxInfo.Metadata; ListFilter selects on them. Bounded (MaxMetadataPairs, ...),
	// and no key may be Roche's own (ReservedMetadataPrefix): see metadataKeyProblem.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Secret is a credential brokered by the egress proxy (Config.Secrets).
type Secret struct {
	// Name is the environment variable that holds the placeholder in the sandbox.
	Name string `json:"name"`
	// Value never goes into the sandbox, the sandbox's stored config, or any log.
	Value string `json:"-"`
	// Hosts are the HOST[:PORT] (443 by default) the value may be sent to.
	Hosts []string `json:"hosts"`
	// Header, if set, is the only request header the value is put in.
	Header string `json:"header,omitempty"`
	// FromStore takes the value from roched's secret store (roche secret set NAME), for
	// the caller's tenant, instead of Value; the sandbox then follows the stored value's
	// rotation. Needs roched, which fills in Value.
	FromStore bool `json:"from_store,omitempty"`
}

// WorkspacePath is where a workspace appears inside a sandbox.
const WorkspacePath = "/workspace"

// ValidWorkspaceName reports whether name can name a workspace or a snapshot: letters,
// digits, '_', '.' and '-', starting with a letter or digit, at most 64 characters.
func ValidWorkspaceName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i, r := range name {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || r != '_' && r != '.' && r != '-') {
			return false
		}
	}
	return true
}

// Mount binds a host path into the sandbox.
type Mount struct {
	Source    string `json:"source"`
	Target    string `json:"target"`
	ReadWrite bool   `json:"read_write,omitempty"`
}

// String renders the mount in the --mount flag's syntax.
func (m Mount) String() string {
	mode := "ro"
	if m.ReadWrite {
		mode = "rw"
	}
	return m.Source + ":" + m.Target + ":" + mode
}

// DefaultConfig returns the secure defaults.
func DefaultConfig() Config {
	return Config{
		Image:       DefaultImage,
		TimeoutSecs: DefaultTimeoutSecs,
		Memory:      DefaultMemory,
		Disk:        DefaultDisk,
		CPUs:        DefaultCPUs,
		PidsLimit:   DefaultPidsLimit,
		User:        DefaultUser,
	}
}

// Validate reports every problem with the config at once, each naming the field and what
// to do, joined into one error that wraps ErrInvalidConfig.
func (c Config) Validate() error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	if strings.TrimSpace(c.Image) == "" {
		add("image is empty: name an image, e.g. roche/python:local")
	}
	if c.TimeoutSecs <= 0 {
		add("timeout_secs is %d: give a positive number of seconds", c.TimeoutSecs)
	}
	if _, err := parseMemory(c.Memory); err != nil {
		add("memory: %v", err)
	}
	if _, err := parseDisk(c.Disk); err != nil {
		add("disk: %v", err)
	}
	if c.WorkspaceSize != "" {
		if c.Workspace == "" {
			add("workspace_size is set without a workspace: name one with workspace, or drop workspace_size")
		} else if n, err := parseDisk(c.WorkspaceSize); err != nil {
			add("workspace_size: %v", err)
		} else if n == 0 {
			add("workspace_size is 0: a workspace always has a size; give one such as %s", DefaultWorkspaceSize)
		}
	}
	if c.CPUs <= 0 || math.IsNaN(c.CPUs) || math.IsInf(c.CPUs, 0) {
		add("cpus is %v: give a positive number such as 0.5 or 2", c.CPUs)
	}
	if c.PidsLimit <= 0 {
		add("pids_limit is %d: give a positive number of processes", c.PidsLimit)
	}
	if strings.TrimSpace(c.User) == "" {
		add("user is empty: give uid[:gid], e.g. 1000:1000, or %s for a uid of the sandbox's own", UserAuto)
	}
	for _, h := range c.NetworkAllowlist {
		if _, err := egress.ParseRule(h); err != nil {
			add("network_allowlist: %v", err)
		}
	}
	seen := map[string]bool{}
	for _, sec := range c.Secrets {
		switch {
		case !envName(sec.Name):
			add("secret %q: name it as an environment variable, such as API_TOKEN", sec.Name)
		case seen[sec.Name]:
			add("secret %s is given twice", sec.Name)
		case c.Env[sec.Name] != "":
			add("secret %s is also in env: drop it from env", sec.Name)
		case egress.ReservedEnv(sec.Name):
			add("secret %s: the sandbox's egress settings use that variable: name the secret otherwise", sec.Name)
		case sec.Value == "" && !sec.FromStore:
			add("secret %s has no value: give it from a file (--secret %s=@FILE) or roched's secret store (--secret %s)", sec.Name, sec.Name, sec.Name)
		case len(sec.Hosts) == 0:
			add("secret %s is bound to no host: give --secret-host %s=HOST", sec.Name, sec.Name)
		case len(c.NetworkAllowlist) == 0:
			add("secret %s needs network_allowlist (--allow-host) allowing its hosts", sec.Name)
		case strings.ContainsAny(sec.Header, " :\r\n"):
			add("secret %s: header %q is not a header name", sec.Name, sec.Header)
		}
		seen[sec.Name] = true
		if _, err := egress.ParseSecretHosts(sec.Name, sec.Hosts); err != nil {
			add("%v", err)
		}
	}
	if c.Network && c.EgressLearn {
		add("network and egress_learn are both set: learn mode works on the allowlist's proxy, so drop network")
	}
	if c.Network && len(c.NetworkAllowlist) > 0 {
		add("network and network_allowlist are both set: the allowlist works without a network interface, so drop network")
	}
	if c.FromSnapshot != "" && !ValidWorkspaceName(c.FromSnapshot) {
		add("from_snapshot %q is not a snapshot name: use letters, digits, '_', '.' and '-'", c.FromSnapshot)
	}
	if c.Workspace != "" && !ValidWorkspaceName(c.Workspace) {
		add("workspace %q: use letters, digits, '_', '.' and '-', starting with a letter or digit, at most 64 characters", c.Workspace)
	}
	if c.Workspace != "" {
		for _, m := range c.Mounts {
			if path.Clean(m.Target) == WorkspacePath {
				add("mount target %s is where the workspace goes: mount elsewhere, or drop the workspace", WorkspacePath)
			}
		}
	}
	if c.Workdir != "" && !path.IsAbs(c.Workdir) {
		add("workdir %q is not absolute: give a path starting with /", c.Workdir)
	}
	for _, m := range c.Mounts {
		if m.Source == "" || !path.IsAbs(m.Source) {
			add("mount source %q is not an absolute host path", m.Source)
		}
		if m.Target == "" || !path.IsAbs(m.Target) {
			add("mount target %q is not an absolute path inside the sandbox", m.Target)
		} else if path.Clean(m.Target) == "/" {
			add("mount target / would hide the image: mount somewhere below it")
		}
	}
	problems = append(problems, c.limitProblems()...)
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
}

// envName reports whether s is an environment variable name: letters, digits and '_',
// not starting with a digit.
func envName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r == '_' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// MemoryBytes returns the memory limit in bytes. Call Validate first.
func (c Config) MemoryBytes() int64 {
	n, _ := parseMemory(c.Memory)
	return n
}

// agentMemoryReserve is the part of a memory limit the tmpfs mounts never take: room
// for roche-agent (about 5 MiB resident) and a small command once a program has
// filled them.
const agentMemoryReserve = 32 << 20

// TmpSize returns the size of each of the sandbox's tmpfs mounts that live in its memory
// (/tmp and /dev/shm): DefaultTmpSize, or under a memory limit below 160 MiB half of
// what the limit leaves beyond agentMemoryReserve, in whole MiB, at least 1 MiB. A
// tmpfs's memory belongs to no process, so the OOM killer cannot win it back by killing
// one: were the mounts able to fill the limit, the agent, left as the only process,
// would be killed next and the sandbox with it. Sized so, a program that fills them
// gets ENOSPC. Call Validate first.
func (c Config) TmpSize() int64 {
	half := (c.MemoryBytes() - agentMemoryReserve) / 2 &^ (1<<20 - 1)
	return max(1<<20, min(DefaultTmpSize, half))
}

// DiskBytes returns the disk limit in bytes, 0 for none. Call Validate first.
func (c Config) DiskBytes() int64 {
	n, _ := parseDisk(c.Disk)
	return n
}

// WorkspaceBytes returns the workspace size asked for in bytes, 0 when the config leaves
// it to the workspace (DefaultWorkspaceSize for a new one). Call Validate first.
func (c Config) WorkspaceBytes() int64 {
	if c.WorkspaceSize == "" {
		return 0
	}
	n, _ := parseDisk(c.WorkspaceSize)
	return n
}

// parseDisk reads a disk or workspace size, between MinDisk and MaxDisk; "0" is no limit.
func parseDisk(s string) (int64, error) {
	v, err := size.Parse(s)
	switch {
	case err != nil:
		return 0, err
	case v == 0:
		return 0, nil
	case v < MinDisk:
		return 0, fmt.Errorf("%q is below the 8m minimum (0 is no limit)", s)
	case v > MaxDisk:
		return 0, fmt.Errorf("%q is above the 1t maximum", s)
	}
	return v, nil
}

// minMemory is Docker's floor for a memory limit; below it no runtime can start a process.
const minMemory = 6 << 20

// parseMemory reads a memory limit, at least minMemory (MaxMemory is checked with the
// other limits).
func parseMemory(s string) (int64, error) {
	v, err := size.Parse(s)
	if err != nil {
		return 0, err
	}
	if v < minMemory {
		return 0, fmt.Errorf("%q is below the 6m minimum a sandbox needs", s)
	}
	return v, nil
}
