// Package guest speaks to roche-agent, the small program that runs as PID 1 in every
// sandbox and serves exec, signals, background processes, terminals and files over a unix
// socket. Its packages are called guest (the side inside the sandbox) so that "agent"
// keeps meaning the AI agents that Roche serves; the binary keeps its name.
//
// The wire protocol is deliberately tiny, so the agent stays small and an exec costs one
// connection and a handful of frames: every frame is a one-byte kind, a four-byte
// big-endian length and that many bytes of payload. A client opens one connection per
// operation, sends a request frame (JSON) and, depending on the operation, stdin or file
// data frames; the agent answers with output or data frames and ends with a result or an
// error frame.
package guest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Frame kinds.
const (
	FrameRequest    = 'R' // client → agent: JSON Request, always first
	FrameStdin      = 'I' // client → agent: stdin bytes
	FrameStdinEOF   = 'i' // client → agent: stdin closed
	FrameSignal     = 'S' // client → agent: JSON SignalRequest for the running command
	FrameStdout     = 'O' // agent → client: stdout bytes
	FrameStderr     = 'E' // agent → client: stderr bytes
	FrameResult     = 'X' // agent → client: JSON Result, the last frame of a command
	FrameData       = 'D' // either way: file or archive bytes
	FrameDataEOF    = 'd' // either way: end of data
	FrameReply      = 'K' // agent → client: JSON reply of a non-streaming operation
	FrameError      = 'Z' // agent → client: JSON Error, the last frame
	FrameStarted    = 'P' // agent → client: JSON Started, the command is running (a foreground command's comes with its first output or result, or 10 ms after it started)
	FrameCodeResult = 'V' // agent → client: JSON CodeResult, one rich result of a cell
	FrameCodeEnd    = 'W' // agent → client: JSON CodeEnd, the last frame of a cell
	FrameResize     = 'T' // client → agent: JSON Winsize for the running command's terminal
	maxFramePayload = 8 << 20
)

// Operations.
const (
	OpExec   = "exec"
	OpAttach = "attach" // reconnect to a durable command, from byte offsets (From)
	OpPs     = "ps"     // list durable commands
	OpSignal = "signal" // signal a command's process group
	OpInput  = "input"  // Data to a durable command's stdin, or typed into its terminal
	OpResize = "resize" // set a background process's terminal size (Cols, Rows)
	OpHealth = "health"
	OpWrite  = "write" // write a file from data frames
	OpRead   = "read"  // read a file as data frames
	OpList   = "list"  // list a directory
	OpStat   = "stat"
	OpMkdir  = "mkdir"
	OpRemove = "remove"
	OpRename = "rename"
	OpUntar  = "untar" // extract a tar stream (data frames) at Path
	OpTar    = "tar"   // send Path as a tar stream (data frames)
	// OpLease holds the sandbox's lease for as long as the connection stays open; with
	// Keep it ends the lease instead, and the sandbox lives out its lifetime. Only a
	// sandbox started with a lease (--lease-grace) has one.
	OpLease = "lease"
	// OpLifetime ends the sandbox LifetimeMS from now instead of when it was to end,
	// sooner or later: the agent's own timer, the one that ends the sandbox, is reset.
	// Only a sandbox started with a lifetime has one to reset.
	OpLifetime = "lifetime"
	// OpSnapshotPrepare (microVMs over the serial link) readies the agent for a memory
	// snapshot: once it has answered, it gives up its session with the host and waits
	// for vmlink.RelinkLine(Nonce), then greets again (the host of a restored VM is a
	// new process with a new link). A leased sandbox's lease is held meanwhile.
	OpSnapshotPrepare = "snapshot_prepare"
	// OpRestored follows a restore from a memory snapshot: Seed is mixed into the
	// kernel's random pool and its generator reseeded (two VMs restored from one
	// snapshot must not draw the same numbers), the clock is set to TimeUnixNS, the
	// hostname to Hostname (a fork is a new sandbox), the lifetime to LifetimeMS, and
	// the lease held since OpSnapshotPrepare is let go (the host takes it anew).
	OpRestored = "restored"

	// Code contexts: long-lived interpreters (internal/guest/kernel) that keep their variables
	// from one cell to the next. code_run streams stdout and stderr frames and code
	// result frames and ends with a code end frame (or an error frame when the cell could
	// not be run); the others answer with one reply frame.
	OpCodeRun     = "code_run"     // Code in Context (or Language's default context)
	OpCodeCreate  = "code_create"  // Language, Cwd, Env → CodeContext
	OpCodeList    = "code_list"    // → []CodeContext
	OpCodeRestart = "code_restart" // Context: a fresh interpreter, variables gone
	OpCodeRemove  = "code_remove"  // Context: stopped and forgotten
	OpCodeFork    = "code_fork"    // Context: a new context, a copy of its interpreter → CodeContext
	// OpCodeWarm starts Language's interpreter ahead of its first context, with Cwd and
	// Env; the next context started with the same Cwd and Env takes it (a warm pool's
	// sandboxes wait with one running). Only one is kept; a second call replaces it.
	OpCodeWarm = "code_warm"
)

// Lease timing: a leased sandbox stops this long after the last connection holding its
// lease closed (its creator died or let go), and, when no lease was ever taken, this long
// after it started (its creator died while making it).
const (
	DefaultLeaseGrace = 3 * time.Second
	DefaultFirstLease = 30 * time.Second
)

// Request is the first frame of every connection.
type Request struct {
	Op string `json:"op"`

	// exec
	Cmd         []string          `json:"cmd,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Cwd         string            `json:"cwd,omitempty"`
	TimeoutMS   int64             `json:"timeout_ms,omitempty"`
	OutputLimit int64             `json:"output_limit,omitempty"`
	Stdin       bool              `json:"stdin,omitempty"`
	// Background starts a durable command and answers at once with its started frame:
	// the command belongs to the sandbox, not to the connection, and its output is kept
	// in a window of Window bytes per stream for OpAttach. With Stdin, its stdin stays
	// open for OpInput until EndInput.
	Background bool `json:"background,omitempty"`
	// Window is how many bytes of each stream a durable command keeps (0: DefaultWindow;
	// at most MaxWindow). A terminal keeps OutputLimit's worth when Window is 0.
	Window int64 `json:"window,omitempty"`
	// Tag names a durable command for the caller (select it with Tag instead of PID).
	Tag string `json:"tag,omitempty"`
	// Key is an idempotency key: a second exec with the key of a command the agent still
	// remembers does not start another but joins that one (a foreground exec replays its
	// output from the start; a background one answers with its started frame, Existing
	// set). A keyed foreground command is durable: a dropped connection leaves it running.
	Key string `json:"key,omitempty"`
	// MaxDurable, when positive and below MaxDurable, is how many durable commands may
	// run at once in the sandbox (roched's --max-commands).
	MaxDurable int `json:"max_durable,omitempty"`
	// TTY runs the command on a pseudo-terminal of Cols×Rows as its controlling terminal
	// (it leads a session of its own, so a typed Ctrl-C reaches its foreground job);
	// output is one stream, FrameStdout, and FrameResize frames resize it. An empty Cmd
	// runs the image's shell (/bin/bash, else /bin/sh).
	TTY  bool   `json:"tty,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	Rows uint16 `json:"rows,omitempty"`

	// attach, signal, input, resize: the command is PID, or, without one, the newest
	// durable command tagged Tag.
	PID    int    `json:"pid,omitempty"`
	Signal int    `json:"signal,omitempty"`
	Data   []byte `json:"data,omitempty"`
	// EndInput, with input, ends the terminal's input after Data: from then on its program
	// reads end of input (Ctrl-D) each time it waits for input, as a pipe's reader does at
	// its end. FrameStdinEOF does the same for a terminal's own connection.
	EndInput bool `json:"end_input,omitempty"`
	// From, with attach, is where in each stream the replay starts (a negative offset:
	// the stream's current end); without it, at the first byte still kept.
	From *Offsets `json:"from,omitempty"`

	// files
	Path      string `json:"path,omitempty"`
	NewPath   string `json:"new_path,omitempty"`
	Mode      uint32 `json:"mode,omitempty"`
	Parents   bool   `json:"parents,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	// Depth and MaxEntries bound a walk (files.go); MaxBytes, when positive, refuses a
	// read of a larger file before any of it is sent.
	Depth      int   `json:"depth,omitempty"`
	MaxEntries int   `json:"max_entries,omitempty"`
	MaxBytes   int64 `json:"max_bytes,omitempty"`

	// lease
	Keep bool `json:"keep,omitempty"`

	// lifetime: what is left of it from now, in milliseconds (at least 1)
	LifetimeMS int64 `json:"lifetime_ms,omitempty"`

	// snapshot_prepare, restored
	Nonce      string `json:"nonce,omitempty"`
	Seed       []byte `json:"seed,omitempty"`
	TimeUnixNS int64  `json:"time_unix_ns,omitempty"`
	Hostname   string `json:"hostname,omitempty"`

	// code contexts (with Cwd, Env, TimeoutMS and OutputLimit above; Cwd and Env start
	// the interpreter of a context made by the call)
	Code     string `json:"code,omitempty"`
	Language string `json:"language,omitempty"`
	Context  string `json:"context,omitempty"`

	// TraceParent (exec, code_run), a W3C traceparent, asks for the agent's spans of
	// the request with its result (trace.go).
	TraceParent string `json:"traceparent,omitempty"`
}

// CodeContext describes a code context.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd,omitempty"`
	Default  bool   `json:"default,omitempty"`
}

// CodeResult is one rich result of a cell: MIME type to content, images in base64
// (the kernel's result event, passed on as it came).
type CodeResult struct {
	Data map[string]string `json:"data"`
	Main bool              `json:"main,omitempty"`
}

// CodeError is the exception that ended a cell, or why its interpreter died.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// CodeEnd ends a cell.
type CodeEnd struct {
	Context        string     `json:"context"`
	ExecutionCount int        `json:"execution_count"`
	Error          *CodeError `json:"error,omitempty"`
	TimedOut       bool       `json:"timed_out,omitempty"`
	// Restarted: the context's interpreter had died and a fresh one ran the cell.
	Restarted bool `json:"restarted,omitempty"`
	// Died: the interpreter died in this cell (Error says how); the next cell starts a
	// fresh one and says Restarted.
	Died       bool  `json:"died,omitempty"`
	Truncated  bool  `json:"truncated,omitempty"`
	DurationNS int64 `json:"duration_ns"`
	// Spans are the agent's spans of the cell, when the request asked (TraceParent).
	Spans []Span `json:"spans,omitempty"`
}

// Offsets are byte offsets into a command's stdout and stderr, counted from its start.
type Offsets struct {
	Stdout int64 `json:"stdout"`
	Stderr int64 `json:"stderr"`
}

// Result ends a command.
type Result struct {
	PID      int `json:"pid"`
	ExitCode int `json:"exit_code"`
	// Signal is the signal that killed the command (ExitCode is then 128 + Signal), 0
	// when it exited.
	Signal     int   `json:"signal,omitempty"`
	TimedOut   bool  `json:"timed_out,omitempty"`
	Truncated  bool  `json:"truncated,omitempty"`
	OOMKilled  bool  `json:"oom_killed,omitempty"`
	DurationNS int64 `json:"duration_ns"`
	// Receipt is what the command used; an agent from before receipts sends none.
	Receipt *Receipt `json:"receipt,omitempty"`
	// Spans are the agent's spans of the command, when the request asked (TraceParent).
	Spans []Span `json:"spans,omitempty"`
}

// Receipt is what a command used: its process tree's rusage (the command's and every
// descendant's it waited for) and the processes of its tree and group left running.
type Receipt struct {
	// PeakMemoryBytes is the largest resident set of any one process (ru_maxrss).
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
	// CPUTimeNS is user plus system CPU time.
	CPUTimeNS int64 `json:"cpu_time_ns"`
	// Leftover counts the processes still running when it exited.
	Leftover int `json:"leftover"`
	// End is why the command ended or was cut when something other than the command
	// did it, a roche.EndKind: "command_timeout", "oom", "pids", "output_cap"; empty
	// when it ended on its own. Evidence is what End was read from.
	End      string `json:"end,omitempty"`
	Evidence string `json:"evidence,omitempty"`
}

// Started tells the client a command is running. On attach (and on a keyed exec that
// joined a command) From is where the replay that follows starts.
type Started struct {
	PID  int      `json:"pid"`
	Tag  string   `json:"tag,omitempty"`
	From *Offsets `json:"from,omitempty"`
	// Existing: the request's idempotency key named a command started before, which this
	// connection joined instead of starting another.
	Existing bool `json:"existing,omitempty"`
}

// SignalRequest asks the agent to signal the running command's process group.
type SignalRequest struct {
	Signal int `json:"signal"`
}

// Winsize is a terminal's size in characters.
type Winsize struct {
	Cols uint16 `json:"cols"`
	Rows uint16 `json:"rows"`
}

// Process describes a durable command.
type Process struct {
	PID      int               `json:"pid"`
	Cmd      []string          `json:"cmd"`
	Tag      string            `json:"tag,omitempty"`
	Env      map[string]string `json:"env,omitempty"` // as the request gave it
	Cwd      string            `json:"cwd,omitempty"`
	Running  bool              `json:"running"`
	ExitCode int               `json:"exit_code"`
	TTY      bool              `json:"tty,omitempty"`
	// Stdin: its stdin is open for OpInput.
	Stdin     bool  `json:"stdin,omitempty"`
	StartedNS int64 `json:"started_ns"` // unix nanoseconds
	Window    int64 `json:"window"`
	// First is the offset of the first byte still kept of each stream, End of the next
	// byte to come (the stream's length so far).
	First Offsets `json:"first"`
	End   Offsets `json:"end"`
	// Result is how it ended, once it has; Stopping, instead, says why its exit status
	// is not its own (the sandbox stopped under it).
	Result   *Result `json:"result,omitempty"`
	Stopping string  `json:"stopping,omitempty"`
}

// Durable commands' bounds.
const (
	// DefaultWindow and MaxWindow bound the output a durable command keeps per stream.
	DefaultWindow = 16 << 20
	MaxWindow     = 64 << 20
	// MaxDurable is how many durable commands may run at once in one sandbox.
	MaxDurable = 64
	// MaxTag and MaxKey bound a tag's and an idempotency key's bytes.
	MaxTag = 256
	MaxKey = 256
)

// FileInfo describes a file in the sandbox.
type FileInfo struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"`
	IsDir   bool   `json:"is_dir"`
	Symlink string `json:"symlink,omitempty"`
	ModTime int64  `json:"mod_time_unix"`
	// Type is TypeFile, TypeDir, TypeSymlink, ... (files.go); ModTimeNS the modification
	// time in nanoseconds; UID, GID and their names (from the sandbox's /etc/passwd and
	// /etc/group, empty when it has none) the owner.
	Type      string `json:"type,omitempty"`
	ModTimeNS int64  `json:"mod_time_ns,omitempty"`
	UID       int    `json:"uid"`
	GID       int    `json:"gid"`
	Owner     string `json:"owner,omitempty"`
	Group     string `json:"group,omitempty"`
}

// Health reports the agent's state.
type Health struct {
	PID      int    `json:"pid"`
	RSSBytes int64  `json:"rss_bytes"`
	Version  string `json:"version"`
	Procs    int    `json:"procs"`
}

// Error codes, mapped to roche's sentinel errors by the client.
const (
	CodeNotFound    = "not_found"
	CodeInvalid     = "invalid"
	CodeUnsupported = "unsupported"
	CodePermission  = "permission"
	CodeNoSpace     = "no_space" // ENOSPC or EDQUOT: the sandbox's disk or /tmp is full
	CodeInternal    = "internal"
	// CodeStopping ends a command cut short because the sandbox itself is stopping (its
	// engine stopped it, it is being destroyed, or its lifetime ended), instead of a result
	// whose exit status (143 for SIGTERM) would look like the command's own doing.
	CodeStopping = "stopping"
	// CodeGone refuses an attach from an offset the command's window no longer keeps;
	// Error.Kept names the first offsets still kept.
	CodeGone = "gone"
	// CodeExhausted refuses a durable command past MaxDurable, or a watch past a limit
	// of the agent or of the sandbox user's (inotify instances or watches).
	CodeExhausted = "exhausted"
)

// Error is the last frame of a failed operation.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Kept, with CodeGone, is the first offset still kept of each stream.
	Kept *Offsets `json:"kept,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// WriteFrame writes one frame. A frame is at most maxFramePayload: a request frame
// carries argv and env as JSON, where a character such as '<' takes six bytes, and 8 MiB
// holds the most the limits allow (roche.MaxArgvBytes and twice roche.MaxEnvBytes, all
// of them such characters).
func WriteFrame(w io.Writer, kind byte, payload []byte) error {
	if len(payload) > maxFramePayload {
		// Refused here with the reason, rather than by the reader with a broken pipe.
		return fmt.Errorf("agent frame of %d bytes is over the %d limit", len(payload), maxFramePayload)
	}
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.Write(hdr[:])
		return err
	}
	// One write per frame keeps frames whole when several goroutines share a connection
	// behind a mutex, and halves the syscalls for small frames.
	if len(payload) <= 4096 {
		buf := make([]byte, 0, 5+len(payload))
		buf = append(append(buf, hdr[:]...), payload...)
		_, err := w.Write(buf)
		return err
	}
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// WriteJSON writes v as one frame.
func WriteJSON(w io.Writer, kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(w, kind, b)
}

// ReadFrame reads one frame into buf (grown as needed) and returns its kind and payload.
func ReadFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFramePayload {
		return 0, nil, fmt.Errorf("agent frame of %d bytes is over the %d limit", n, maxFramePayload)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[0], buf, nil
}

// ThreadReserve is how many threads roche-agent holds from its start. A sandbox's PID
// limit counts threads, and a fork bomb uses up every free one; a Go program that then
// needs a new thread dies. So the agent creates its threads up front, and a provider
// adds ThreadReserve to the container's limit: the sandbox's programs get exactly the
// limit the caller asked for, and the agent never needs a thread they could take.
const ThreadReserve = 24

// ThreadCeiling is how many threads a provider lets roche-agent have beside the sandbox's
// own limit, in a ceiling on the whole sandbox (a container's pids cgroup): its
// ThreadReserve and as many again for what the Go runtime may start later. The sandbox's
// programs are held to their limit by the agent (RLIMIT_NPROC, Config.NProc), so the
// ceiling never binds before it and costs them nothing.
const ThreadCeiling = 2 * ThreadReserve

// OpenFiles is the open-file limit (RLIMIT_NOFILE, soft and hard) roche-agent sets for
// itself and so for every command it starts, unless told another: with the sandbox's
// process limit it bounds the files a sandbox holds open on the host (64 x 1024 by
// default), where the kernel's limit (fs.file-max) is shared by every sandbox.
const OpenFiles = 1024

// MaxChunk is the largest data payload either side sends in one frame.
const MaxChunk = 256 << 10
