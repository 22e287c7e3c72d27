// Package agentspec is how a provider starts roche-agent as a sandbox's PID 1: where the
// binary and its sockets appear inside a container, the capabilities it starts with, and
// its command line, built from a Spec (Args) rather than by hand in each provider. The
// flags are roche-agent's own (internal/guest/guestcmd), and a test reads every field of
// a Spec back through them. (A microVM's agent is configured by a file instead:
// internal/guest/vmlink.)
package agentspec

import (
	"strconv"
	"time"

	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest"
)

// Where roche-agent and its socket directory appear inside a container (the docker and
// oci providers; a Pod's are internal/guest/podlink's).
const (
	Binary = "/.roche/roche-agent"
	RunDir = "/.roche/run"
	// SocketName and EgressSocketName are the agent's socket and the host's egress
	// proxy socket, in RunDir.
	SocketName       = "agent.sock"
	EgressSocketName = "egress.sock"
)

// Transport is the SandboxInfo.Transport of a sandbox whose commands reach it through
// its agent.
const Transport = "agent"

// Caps are the capabilities the agent starts with (without the CAP_ prefix): to run
// commands as the sandbox user (SETUID, SETGID), drop the bounding set at start
// (SETPCAP), kill commands (KILL) and serve files as that user (CHOWN, DAC_OVERRIDE). It
// drops every capability from its bounding set before it starts anything, so the
// sandbox's programs hold none (CapEff, CapPrm and CapBnd are 0).
var Caps = []string{"SETUID", "SETGID", "SETPCAP", "KILL", "CHOWN", "DAC_OVERRIDE"}

// LeaseGrace is how long a leased sandbox outlives the loss of its lease.
const LeaseGrace = guest.DefaultLeaseGrace

// FirstLease is how long the agent of a leased sandbox waits for its creator to take the
// lease, counted from the agent's start: the rest of the create's own deadline (bound,
// the provider's engine or boot timeout) and a little more, so that a creator killed
// during its create leaves the sandbox for no longer than that.
func FirstLease(bound time.Duration) time.Duration { return bound + 5*time.Second }

// Spec is how one sandbox's agent is started.
type Spec struct {
	// Socket is the unix socket the agent serves on, as a path inside the sandbox.
	Socket string
	// ConnFD, when positive, replaces Socket: the descriptor the agent inherits holding
	// its one connection, a one-shot sandbox's (the runtime passes it in).
	ConnFD int
	// Owner is the host uid allowed to connect to the socket.
	Owner int
	// User is who commands run as: "uid:gid" or the caller's user.
	User string
	// Lifetime ends the sandbox this long after the agent starts (0: never).
	Lifetime time.Duration
	// NProc holds the sandbox user to exactly this many processes and threads
	// (RLIMIT_NPROC; 0: no cap).
	NProc int
	// ForkAsUser starts commands from a thread running as the sandbox user, so that a
	// kernel counting tasks by their creator's user (gVisor) counts them against NProc.
	ForkAsUser bool
	// ScratchMax, when positive, makes the agent refuse to start unless /tmp and
	// /dev/shm are tmpfs of at most this many bytes (gVisor Pods: their mount hints).
	ScratchMax int64
	// Own is a directory handed to the sandbox user at start if root owns it (a
	// workspace's mount point); "" for none.
	Own string
	// ChownFrom, when positive, is the uid whose files on the root filesystem are handed
	// to the sandbox user at start (the sandbox's a snapshot was taken of).
	ChownFrom int
	// EgressSocket, when set, is the host's egress proxy socket inside the sandbox: the
	// agent accepts proxy connections on egress.SandboxListen and relays them there.
	EgressSocket string
	// Lease, when positive, makes the sandbox leased and is its create's deadline: the
	// agent stops it LeaseGrace after its last lease holder goes, or FirstLease(Lease)
	// after its start when no lease was taken.
	Lease time.Duration
	// Grace, when positive, replaces LeaseGrace: how long the sandbox outlives its last
	// lease holder (roched replicas give a client's Hold time to move to another one).
	Grace time.Duration
}

// Args is the agent's command line for s, without the program name.
func (s Spec) Args() []string {
	args := []string{"--socket", s.Socket}
	if s.ConnFD > 0 {
		args = []string{"--conn-fd", strconv.Itoa(s.ConnFD)}
	}
	args = append(args,
		"--user", s.User,
		"--lifetime", duration(s.Lifetime),
		"--owner", strconv.Itoa(s.Owner),
	)
	if s.NProc > 0 {
		args = append(args, "--nproc", strconv.Itoa(s.NProc))
	}
	if s.ForkAsUser {
		args = append(args, "--fork-as-user")
	}
	if s.ScratchMax > 0 {
		args = append(args, "--scratch-max", strconv.FormatInt(s.ScratchMax, 10))
	}
	if s.Own != "" {
		args = append(args, "--own", s.Own)
	}
	if s.ChownFrom > 0 {
		args = append(args, "--chown-from", strconv.Itoa(s.ChownFrom))
	}
	if s.EgressSocket != "" {
		args = append(args, "--egress-listen", egress.SandboxListen, "--egress-socket", s.EgressSocket)
	}
	if s.Lease > 0 {
		grace := LeaseGrace
		if s.Grace > 0 {
			grace = s.Grace
		}
		args = append(args,
			"--lease-grace", strconv.FormatInt(grace.Milliseconds(), 10)+"ms",
			"--first-lease", strconv.FormatInt(FirstLease(s.Lease).Milliseconds(), 10)+"ms")
	}
	return args
}

// duration writes d as roche-agent's flags read it, in whole seconds when it is some.
func duration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}
