// Package roche is the API of Roche, a sandbox orchestrator for AI agents that run
// untrusted code. It defines the sandbox Config with its secure defaults, the Provider
// interface that every isolation backend implements (provider/docker, provider/wasm, ...),
// the optional interfaces a caller finds on a provider by type assertion (Pauser,
// FileSystem, CodeRunner, Terminal, ...), and the requests, results and errors they
// exchange. It knows nothing of any particular backend.
//
// It is what a program using Roche needs, and only that: what a provider's author
// needs besides is in provider/kit.
package roche

import (
	"context"
	"io"
	"io/fs"
	"time"
)

// Provider is an isolation backend. The required surface is small; extras (files,
// pause, garbage collection) are optional interfaces found by type assertion, and
// Capabilities says which config fields the backend can honour.
type Provider interface {
	// Name is the provider's name as given to --provider, e.g. "docker".
	Name() string
	// Capabilities reports what this backend supports.
	Capabilities() Capabilities
	// Create makes and starts a sandbox. On error nothing is left behind.
	Create(ctx context.Context, cfg Config) (SandboxInfo, error)
	// Exec runs a command in the sandbox and waits for it. A non-zero exit, a timeout or
	// an OOM kill are results, not errors; errors mean the command could not be run.
	Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error)
	// Destroy removes the sandbox and everything created for it. It is idempotent:
	// destroying a sandbox that is already gone (or never existed) succeeds, so callers
	// can always defer it. Use Inspect to tell whether an id names a sandbox.
	Destroy(ctx context.Context, id string) error
	// Inspect describes one sandbox; an id that names no Roche sandbox is ErrNotFound.
	Inspect(ctx context.Context, id string) (SandboxInfo, error)
	// List returns the sandboxes this provider manages, running or not.
	List(ctx context.Context) ([]SandboxInfo, error)
}

// FileCopier copies files and directories between the host and a sandbox.
type FileCopier interface {
	// CopyTo copies the host path src into the sandbox at dst.
	CopyTo(ctx context.Context, id, src, dst string) error
	// CopyFrom copies the sandbox path src to the host path dst.
	CopyFrom(ctx context.Context, id, src, dst string) error
}

// Pauser freezes and thaws every process in a sandbox.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Unpause(ctx context.Context, id string) error
}

// MemorySnapshotter saves a running sandbox whole, memory and processes included, and
// brings it back (microVMs: provider/vm's qemu). E2B's names: pause is PauseToDisk,
// resume is Resume; Fork has no E2B name.
type MemorySnapshotter interface {
	// PauseToDisk saves the sandbox's memory and device state to disk and stops it: it
	// holds no memory or CPU until Resume, its lifetime paused with it. It stays listed,
	// StatePaused, and survives a restart of the process that paused it.
	PauseToDisk(ctx context.Context, id string) error
	// Resume brings a sandbox paused to disk back where it was: its processes, code
	// contexts and open files, with fresh randomness and the right time.
	Resume(ctx context.Context, id string) (SandboxInfo, error)
	// Fork makes n new sandboxes, each a copy of the running (or paused-to-disk)
	// sandbox id at this moment, with processes and code contexts, each with its own id,
	// lifetime, lease and randomness; id goes on as it was.
	Fork(ctx context.Context, id string, n int) ([]SandboxInfo, error)
}

// MaxForks is the most sandboxes one Fork makes.
const MaxForks = 64

// FileSystem reads and writes files inside a sandbox, with the sandbox user's
// permissions. Paths are absolute sandbox paths; content is streamed, binary-safe.
type FileSystem interface {
	// WriteFile writes r to path, replacing it, creating missing parents.
	WriteFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) error
	// ReadFile streams path to w.
	ReadFile(ctx context.Context, id, path string, w io.Writer) error
	// ListDir lists a directory.
	ListDir(ctx context.Context, id, path string) ([]FileInfo, error)
	// Stat describes path without following a final symlink.
	Stat(ctx context.Context, id, path string) (FileInfo, error)
	// Mkdir makes a directory and any missing parents.
	Mkdir(ctx context.Context, id, path string) error
	// Remove removes path and, for a directory, everything below it.
	Remove(ctx context.Context, id, path string) error
	// Rename moves from to to.
	Rename(ctx context.Context, id, from, to string) error
}

// WorkspaceManager lists and removes persistent workspaces (Config.Workspace).
type WorkspaceManager interface {
	Workspaces(ctx context.Context) ([]Workspace, error)
	// RemoveWorkspace deletes a workspace and its files; ErrInUse while a sandbox has it.
	RemoveWorkspace(ctx context.Context, name string) error
}

// Workspace is a persistent workspace.
type Workspace struct {
	Name      string    `json:"name"`
	Provider  string    `json:"provider"`
	CreatedAt time.Time `json:"created_at"`
	// InUseBy lists the sandboxes that have it mounted.
	InUseBy []string `json:"in_use_by,omitempty"`
	// SizeBytes is what it may hold (Config.WorkspaceSize when it was made); 0 for one
	// made before workspaces had sizes.
	SizeBytes int64 `json:"size_bytes,omitempty"`
}

// Resetter puts a sandbox back to a clean state.
type Resetter interface {
	// Reset recreates the sandbox from its image and config, discarding every change to
	// its filesystem and every process, and returns the new sandbox (with a new id). Its
	// workspace is kept, or emptied when keepWorkspace is false.
	Reset(ctx context.Context, id string, keepWorkspace bool) (SandboxInfo, error)
}

// Snapshotter saves a sandbox's files under a name, to create new sandboxes from
// (Config.FromSnapshot). Process memory is not kept: a sandbox made from a snapshot
// starts with no processes running. A workspace is not part of a snapshot; it
// persists on its own.
type Snapshotter interface {
	Snapshot(ctx context.Context, id, name string) (Snapshot, error)
	Snapshots(ctx context.Context) ([]Snapshot, error)
	// RemoveSnapshot deletes a snapshot; ErrInUse while a sandbox was made from it and lives.
	RemoveSnapshot(ctx context.Context, name string) error
}

// Snapshot is a saved sandbox filesystem.
type Snapshot struct {
	Name      string    `json:"name"`
	Provider  string    `json:"provider"`
	Image     string    `json:"image"` // the image the sandbox was made from
	CreatedAt time.Time `json:"created_at"`
}

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Name    string      `json:"name"`
	Path    string      `json:"path"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	IsDir   bool        `json:"is_dir"`
	Symlink string      `json:"symlink,omitempty"`
	ModTime time.Time   `json:"mod_time"`
	// UID and GID own it; Owner and Group are their names in the sandbox's /etc/passwd
	// and /etc/group ("" when it has none).
	UID   int    `json:"uid"`
	GID   int    `json:"gid"`
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
}

// GarbageCollector removes expired sandboxes (or, with All, every one) that were
// left behind, for example by a crashed caller.
type GarbageCollector interface {
	GC(ctx context.Context, opts GCOptions) ([]SandboxInfo, error)
}

// GCOptions selects what GC removes.
type GCOptions struct {
	// All removes every Roche sandbox, not only the expired ones.
	All bool
	// DryRun reports what would be removed without removing it.
	DryRun bool
	// Owner, when set, limits the GC to sandboxes with this SandboxInfo.Owner, so that a
	// user's gc leaves other users' and daemons' sandboxes alone. Empty means any owner.
	Owner string
}

// Capabilities states what a provider can honour. A provider refuses, with
// ErrUnsupported, a Config that asks for something it cannot do; fields listed in
// NotApplicable have no meaning for the backend (a WASM module has no PIDs) and are
// accepted and ignored.
type Capabilities struct {
	Network   bool // network=true can be given
	Egress    bool // network_allowlist can be given
	Writable  bool // writable=true can be given
	Mounts    bool // host mounts can be given
	Files     bool // implements FileCopier
	Pause     bool // implements Pauser
	Stdin     bool // ExecRequest.Stdin is passed to the command
	Processes bool // sandboxes are Linux process trees with /proc (fork, signals, users)
	Leases    bool // sandboxes can be tied to their creator (leased through the API; kit.Leaser)
	// Code lists the languages whose contexts RunCode serves (implements CodeRunner).
	Code []string `json:"code,omitempty"`
	// RichResults: code can return images, HTML and JSON (display calls, figures) and not
	// only text; false where the interpreter has no such machinery (python.wasm).
	RichResults bool `json:"rich_results,omitempty"`
	// NotApplicable names Config fields (by their JSON names) the backend ignores
	// because they cannot matter there.
	NotApplicable []string `json:"not_applicable,omitempty"`
}

// SandboxState is a sandbox's lifecycle state.
type SandboxState string

const (
	StateRunning SandboxState = "running"
	StatePaused  SandboxState = "paused"
	StateExited  SandboxState = "exited"
	StateCreated SandboxState = "created"
)

// SandboxInfo describes a sandbox.
type SandboxInfo struct {
	ID        string       `json:"id"`
	Provider  string       `json:"provider"`
	Image     string       `json:"image"`
	State     SandboxState `json:"state"`
	CreatedAt time.Time    `json:"created_at"`
	ExpiresAt time.Time    `json:"expires_at"`
	// Transport says how commands reach the sandbox: "agent" (roche-agent inside it) or a
	// provider's fallback such as "docker-exec", which is slower and has no files API.
	Transport string `json:"transport,omitempty"`
	// Owner names who made the sandbox ("roched:...", "cli:USER@HOST"), and so who may
	// list, adopt and collect it; "" when nobody in particular did (a library caller).
	// The program that creates it sets it, never a user or an API caller.
	Owner string `json:"owner,omitempty"`
	// Metadata is what the create was given as Config.Metadata.
	Metadata map[string]string `json:"metadata,omitempty"`
	// End is why and when it ended, set when State is StateExited and the reason is
	// known to whoever answered (roched remembers ended sandboxes for
	// --ended-retention; see docs/ended.md); nil while it runs.
	End *EndReason `json:"end,omitempty"`
}

// Expired reports whether the sandbox has outlived its lifetime at now.
func (s SandboxInfo) Expired(now time.Time) bool {
	return !s.ExpiresAt.IsZero() && !now.Before(s.ExpiresAt)
}

// ExecRequest is a command to run in a sandbox.
type ExecRequest struct {
	// Cmd is the argv; it must not be empty.
	Cmd []string
	// Env is added to the sandbox's environment for this command.
	Env map[string]string
	// Workdir overrides the sandbox's working directory for this command.
	Workdir string
	// Timeout kills the command (and every process it started) after this long and
	// reports TimedOut. Zero means the sandbox's remaining lifetime.
	Timeout time.Duration
	// Stdin, when set, is copied to the command's standard input (see Capabilities.Stdin).
	Stdin io.Reader
	// Stdout and Stderr, when set, receive output as it is produced, in addition to
	// the capped copy kept in ExecResult.
	Stdout io.Writer
	Stderr io.Writer
	// OutputLimit caps each stream's captured bytes; zero means DefaultOutputLimit.
	OutputLimit int64
	// StreamOnly passes output to Stdout and Stderr (those set) without keeping a copy:
	// the result's Stdout and Stderr are then empty, and Truncated still says whether a
	// stream passed OutputLimit. roched's ExecStream uses it so that it holds no output.
	StreamOnly bool
	// IdempotencyKey, when set, makes the command belong to the sandbox rather than to
	// this call (a durable command, see BackgroundRunner): when the call's connection
	// drops it keeps running, and a retry with the same key joins it (its output from
	// the start, its real result) instead of starting it again. Cancelling the call
	// leaves it running too; SignalCommand stops it. Providers without durable commands
	// refuse it (ErrUnsupported).
	IdempotencyKey string
}

// ExecResult is the outcome of a command.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// TimedOut: the command was killed at its timeout.
	TimedOut bool `json:"timed_out"`
	// Truncated: a stream exceeded the output limit and was cut.
	Truncated bool `json:"truncated"`
	// OOMKilled: the command was killed for exceeding the memory limit.
	OOMKilled bool          `json:"oom_killed"`
	Duration  time.Duration `json:"duration_ns"`
	// Receipt is what the command used (peak memory, CPU time, processes left running),
	// nil where the provider cannot measure it (no roche-agent: wasm, docker-exec).
	Receipt *Receipt `json:"receipt,omitempty"`
}
