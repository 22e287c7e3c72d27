package roche

import (
	"context"
	"fmt"
	"time"
)

// EndKind is why a sandbox ended, one of the End* constants. A provider or a daemon that
// cannot tell says EndUnknown, with why in EndReason.Detail; it never guesses.
type EndKind string

const (
	// EndOOM: killed for exceeding its memory limit; the evidence is the cgroup's
	// memory.events oom_kill counter (read by roche-agent, or the engine's watch of it).
	EndOOM EndKind = "oom"
	// EndPids: its pids limit was reached: a command failed while the sandbox user's
	// processes and threads were at the limit that holds, roche-agent's RLIMIT_NPROC (the
	// kernel counts no fork that limit refuses, so the evidence is roche-agent's count of
	// them in /proc as the command ended). A command's receipt says it; no sandbox ends
	// of it (a fork bomb is held at the limit).
	EndPids EndKind = "pids"
	// EndLifetime: its lifetime (Config.TimeoutSecs, or set_timeout's) was reached.
	EndLifetime EndKind = "lifetime"
	// EndCommandTimeout: a command's timeout ended the sandbox (a command run with the
	// sandbox's remaining lifetime as its timeout).
	EndCommandTimeout EndKind = "command_timeout"
	// EndOutputCap: a command's output passed the cap that ends its sandbox.
	EndOutputCap EndKind = "output_cap"
	// EndLeaseLost: it was leased and its holder went away (the Hold stream or the
	// holding process ended and nobody took it over within the grace).
	EndLeaseLost EndKind = "lease_lost"
	// EndDestroyed: a caller destroyed it; By names which (the tenant, or the owner).
	EndDestroyed EndKind = "destroyed"
	// EndEngineGone: its engine or node went away (an engine restart, a node lost).
	EndEngineGone EndKind = "engine_gone"
	// EndAgentExited: its main process (roche-agent) exited or was killed, for none of
	// the reasons above that could be seen.
	EndAgentExited EndKind = "agent_exited"
	// EndUnknown: it ended and whoever recorded it cannot know why; Detail says why not.
	EndUnknown EndKind = "unknown"
)

// EndKinds lists every kind, for metrics and validation.
var EndKinds = []EndKind{EndOOM, EndPids, EndLifetime, EndCommandTimeout, EndOutputCap,
	EndLeaseLost, EndDestroyed, EndEngineGone, EndAgentExited, EndUnknown}

// Valid reports whether k is one of the End* constants.
func (k EndKind) Valid() bool {
	for _, v := range EndKinds {
		if k == v {
			return true
		}
	}
	return false
}

// EndReason is why and when a sandbox ended, with the evidence it was read from.
type EndReason struct {
	Kind EndKind   `json:"kind"`
	At   time.Time `json:"at"`
	// Detail says it in words: "destroyed by tenant alice", "its lifetime ended at
	// 15:04:05", or, for EndUnknown, why it cannot be known.
	Detail string `json:"detail,omitempty"`
	// Evidence is what the reason was read from, as the source gave it:
	// "memory.events oom_kill 0 -> 1", "docker event oom at 15:04:05.123, then exit 137",
	// "Hold stream ended 15:04:05, grace 10s". Empty for a caller's destroy.
	Evidence string `json:"evidence,omitempty"`
	// By names who ended it, for EndDestroyed: the tenant ("tenant:alice"), or the owner
	// of a direct-mode sandbox ("cli:USER@HOST").
	By string `json:"by,omitempty"`
	// ExitCode is the sandbox's main process's exit status when it is known and
	// ExitKnown is set.
	ExitCode  int  `json:"exit_code,omitempty"`
	ExitKnown bool `json:"exit_known,omitempty"`
}

// String is the reason in one line: "oom at 15:04:05: ... (evidence: ...)".
func (e EndReason) String() string {
	s := string(e.Kind)
	if !e.At.IsZero() {
		s += " at " + e.At.Local().Format(time.TimeOnly)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Evidence != "" {
		s += " (evidence: " + e.Evidence + ")"
	}
	return s
}

// UnknownEnd is an EndUnknown reason saying why the end cannot be known.
func UnknownEnd(at time.Time, why string, args ...any) EndReason {
	return EndReason{Kind: EndUnknown, At: at, Detail: fmt.Sprintf(why, args...)}
}

// EndInspector is a provider that remembers sandboxes that ended (roched's Go client):
// InspectEnded is Inspect that also answers for a sandbox that ended within the
// remembering's retention, state StateExited with End saying why, where Inspect says
// ErrNotFound.
type EndInspector interface {
	InspectEnded(ctx context.Context, id string) (SandboxInfo, error)
}

// DefaultEndedRetention is how long roched remembers why a sandbox ended, for Inspect;
// MaxEndedKept bounds how many ended sandboxes it remembers at once (the oldest go first).
const (
	DefaultEndedRetention = time.Hour
	MaxEndedKept          = 4096
)

// Receipt is what a command used: measured by roche-agent from the rusage of the
// command's process tree (the command and every descendant it waited for) and the
// processes left in its process group when it exited.
type Receipt struct {
	// PeakMemoryBytes is the largest resident set of any process of the tree
	// (ru_maxrss), a lower bound on the tree's peak.
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
	// CPUTime is user plus system CPU time of the tree.
	CPUTime time.Duration `json:"cpu_time_ns"`
	// Leftover counts the processes of its process group still running in the sandbox
	// when it exited (`sleep 100 &`); they go on running.
	Leftover int `json:"leftover_processes"`
	// End is why the command ended or was cut when something other than the command did
	// it: EndCommandTimeout (roche-agent killed it at its timeout), EndOOM (it died of
	// SIGKILL and the sandbox cgroup's memory.events oom_kill grew meanwhile),
	// EndPids (it exited non-zero while the sandbox user's processes and threads, counted
	// in /proc as it ended, its own included, were at RLIMIT_NPROC, the process limit that
	// holds: a sample, which may miss a limit reached and let go before the command
	// ended but never reports one not reached), EndOutputCap (its output passed the cap
	// and was cut); empty when it ended on its own. A command killed at its timeout while
	// the sandbox was at the limit is EndCommandTimeout, the limit in its Evidence.
	// Evidence is what End was read from.
	End      EndKind `json:"end,omitempty"`
	Evidence string  `json:"evidence,omitempty"`
}

// EndedError is an error about a sandbox that ended, carrying why: what a Hold that
// lost its sandbox ends with (client.Holding). It unwraps to Err (roche.ErrNotFound).
type EndedError struct {
	ID  string
	End EndReason
	Err error
}

func (e *EndedError) Error() string {
	return fmt.Sprintf("%v (sandbox %s ended: %s)", e.Err, e.ID, e.End)
}

func (e *EndedError) Unwrap() error { return e.Err }
