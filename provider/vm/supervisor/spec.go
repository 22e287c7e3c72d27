// Package supervisor is the host-side process that keeps one microVM: it runs the
// hypervisor, serves the guest agent's serial link as a unix socket that any number of
// clients can connect to, stops the VM at the end of its lifetime even if the guest is
// wedged, and removes everything the VM had on the host when it ends. It runs detached
// (its own session; as root, the init of its own PID namespace, so that the hypervisor
// dies with it) as `PROGRAM vm-supervise SPEC`, PROGRAM being the executable of the
// process that hosts the provider (roche, roched), so a VM outlives the process that
// created it, as a container outlives `docker run -d`. The in-sandbox roche-agent does
// not carry it: nothing host-side belongs in what runs inside a sandbox.
package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
)

// RunIfAsked makes this process a supervisor, and exits, when it was started as one
// (os.Args[1] is Subcommand); otherwise it returns at once. A program that hosts the
// qemu or firecracker provider calls it first thing in main (cmd/roche and cmd/roched
// do, and provider/vm's tests): the provider starts supervisors from its own executable
// (vm.WithSupervisor says otherwise).
func RunIfAsked() {
	if len(os.Args) < 2 || os.Args[1] != Subcommand {
		return
	}
	if err := Main(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, Subcommand+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Spec is what the provider asks of a supervisor, as JSON in a file of the VM's directory.
type Spec struct {
	// Dir is the VM's state directory on the host; it is removed when the VM ends.
	Dir string `json:"dir"`
	// Argv is the hypervisor's command line.
	Argv []string `json:"argv"`
	// Serial passes one end of a socket pair to the hypervisor as fd 3, for its
	// virtio-serial port, and serves the agent at AgentSocket over it.
	Serial      bool   `json:"serial"`
	AgentSocket string `json:"agent_socket,omitempty"`
	// EgressSocket, with Serial, is the sandbox's egress proxy on the host (served by
	// the process that created the VM): each stream the guest agent opens over the link
	// is joined to a connection to it. Without it, such a stream is closed at once.
	EgressSocket string `json:"egress_socket,omitempty"`
	// Console receives the hypervisor's output (the guest's serial console).
	Console string `json:"console"`
	// DeadlineUnixMS is when the VM is stopped if it has not stopped itself.
	DeadlineUnixMS int64 `json:"deadline_unix_ms"`
	// RemoveDirs are removed, besides Dir, when the VM ends (a jailer's chroot).
	RemoveDirs []string `json:"remove_dirs,omitempty"`
	// Incoming is a saved VM state (a QEMU migration stream) the hypervisor restores
	// from: it is passed as fd 4 (Argv says -incoming fd:4).
	Incoming string `json:"incoming,omitempty"`
	// Relink, with Serial, is the nonce of the guest's relink line: the guest of a VM
	// restored from a snapshot, or one a snapshot was just taken of, waits for
	// vmlink.RelinkLine(Relink) before it greets. SIGUSR2 makes a running supervisor
	// relink with the nonce its spec file then holds.
	Relink string `json:"relink,omitempty"`
}

// Report is written to fd 3 (a pipe to the creating process) when the hypervisor exits.
type Report struct {
	// Exit describes how the hypervisor ended, e.g. "exit status 1".
	Exit string `json:"exit"`
	// Console is the end of the console output.
	Console string `json:"console"`
}

// Files in the VM's directory.
const (
	PIDFile        = "supervisor.pid"  // the supervisor's pid
	HypervisorFile = "hypervisor.pid"  // the hypervisor's pid as the host sees it, then its proctree.StartTime
	SpecFile       = "supervisor.json" // the Spec
	// SuspendedFile, once the hypervisor has exited, keeps the VM's directory: the VM
	// was saved to disk (paused) and is resumed from it later.
	SuspendedFile = "suspended.json"
)

// Subcommand is the argument that makes a program a supervisor (RunIfAsked).
const Subcommand = "vm-supervise"

// Ended is what a supervisor records of its VM's end, for the provider's watch of it
// (kit.Watcher): written to EndedPath(Dir) just before the supervisor removes the VM's
// directory and exits, never for a VM saved to disk (paused), which has not ended.
type Ended struct {
	AtUnixMS int64 `json:"at_unix_ms"`
	// HypervisorPID is the hypervisor's pid; Exit says how it ended in words.
	HypervisorPID int    `json:"hypervisor_pid"`
	Exit          string `json:"exit"`
	// Signal is the signal that killed the hypervisor, when one did; ExitCode its exit
	// status otherwise (ExitKnown).
	Signal    int  `json:"signal,omitempty"`
	ExitCode  int  `json:"exit_code,omitempty"`
	ExitKnown bool `json:"exit_known,omitempty"`
	// Stopped says the supervisor stopped the hypervisor, and why ("stopped by
	// terminated": a destroy; "stopped at the end of its lifetime").
	Stopped string `json:"stopped,omitempty"`
	// Panic is the guest kernel's panic line from the console ("Kernel panic - not
	// syncing: Attempted to kill init! exitcode=0x00000100": roche-agent, PID 1, exited),
	// and OOM its last OOM kill line ("Out of memory: Killed process 1 (roche-agent)").
	Panic string `json:"panic,omitempty"`
	OOM   string `json:"oom,omitempty"`
}

// EndedPath is where the supervisor of the VM in directory dir records its end: beside
// the directory, which goes with the VM.
func EndedPath(dir string) string {
	return filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".ended.json")
}
