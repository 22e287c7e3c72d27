// Package supervisor is the host-side process that keeps one microVM: it runs the
// hypervisor, serves the guest agent's serial link as a unix socket that any number of
// clients can connect to, stops the VM at the end of its lifetime even if the guest is
// wedged, and removes everything the VM had on the host when it ends. It runs detached
// (its own session) as `roche-agent vm-supervise SPEC`, so a VM outlives the process that
// created it, as a container outlives `docker run -d`.
package supervisor

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
	// Console receives the hypervisor's output (the guest's serial console).
	Console string `json:"console"`
	// DeadlineUnixMS is when the VM is stopped if it has not stopped itself.
	DeadlineUnixMS int64 `json:"deadline_unix_ms"`
	// RemoveDirs are removed, besides Dir, when the VM ends (a jailer's chroot).
	RemoveDirs []string `json:"remove_dirs,omitempty"`
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
	HypervisorFile = "hypervisor.pid"  // the hypervisor's pid
	SpecFile       = "supervisor.json" // the Spec
)

// Subcommand is the roche-agent argument that runs a supervisor.
const Subcommand = "vm-supervise"
