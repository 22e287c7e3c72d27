// Package vmlink is what roche-agent inside a microVM and the host agree on: how the agent
// is configured at boot, and how the host reaches it.
//
// Two transports carry the agent's protocol (package guest, one connection per operation):
//
//   - virtio-vsock (Firecracker): the guest agent listens on VsockPort; Firecracker exposes
//     the guest's ports on a host unix socket ("hybrid vsock"), where a connection starts
//     with "CONNECT <port>\n" (DialHybridVsock).
//   - virtio-serial (QEMU, whose vsock needs /dev/vhost-vsock on the host, a module many
//     hosts lack): one byte stream between the guest's port SerialPortName and the host.
//     Connections are multiplexed over it with yamux, chosen because it is small, pure Go,
//     long used in production for exactly this (Nomad, Consul, Vault over one TCP
//     connection), and has per-stream flow control, so one busy command cannot starve the
//     others; a home-made multiplexer would need all of that to be robust. The guest
//     writes Hello first, so the host never sends into a port nobody reads yet.
package vmlink

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/yamux"
)

const (
	// SerialPortName is the virtio-serial port the agent serves on under QEMU.
	SerialPortName = "roche.agent"
	// VsockPort is the vsock port the agent listens on under Firecracker.
	VsockPort = 1024
	// Hello is the line the guest writes on the serial port before the multiplexer starts.
	Hello = "roche-vmlink 1\n"
	// ConfigPath is where the guest finds its GuestConfig (in its initramfs).
	ConfigPath = "/roche/config.json"
	// ModulesPath lists, in load order, the kernel modules in /lib/modules of the initramfs.
	ModulesPath = "/roche/modules"
	// ProbeParam on the kernel command line makes the agent print ProbeMarker on the console
	// and power off at once: the host boots that to learn whether KVM works.
	ProbeParam = "roche.probe=1"
	// DebugParam on the kernel command line makes the agent report each step of the
	// VM's set-up on the console.
	DebugParam = "roche.debug=1"
	// ProbeMarker is what a probe boot prints when it reached the agent.
	ProbeMarker = "ROCHE-VM-PROBE-OK"
	// Transports.
	TransportSerial = "serial"
	TransportVsock  = "vsock"
)

// GuestConfig is the agent's configuration inside a VM, written by the host into a small
// archive appended to the initramfs (the kernel command line is too short for it).
type GuestConfig struct {
	// Hostname of the guest.
	Hostname string `json:"hostname"`
	// User is "uid[:gid]" or a name from the image's /etc/passwd.
	User string `json:"user"`
	// Env is the base environment of every command (the image's, then the sandbox's).
	Env []string `json:"env"`
	// Workdir is the default working directory of commands.
	Workdir string `json:"workdir,omitempty"`
	// LifetimeMS ends the agent, and with it the VM, after this long.
	LifetimeMS int64 `json:"lifetime_ms"`
	// LeaseGraceMS, when positive, makes the sandbox leased (see agent.OpLease);
	// FirstLeaseMS is how long its creator has to take the lease first.
	LeaseGraceMS int64 `json:"lease_grace_ms,omitempty"`
	FirstLeaseMS int64 `json:"first_lease_ms,omitempty"`
	// PidsLimit caps the tasks of the sandbox's commands (a pids cgroup in the guest).
	PidsLimit int `json:"pids_limit"`
	// Writable puts a writable layer (overlay on a guest tmpfs) over the read-only root.
	Writable bool `json:"writable"`
	// DiskSize is the size of the writable layer's tmpfs in bytes (Config.Disk); 0 is the
	// kernel's default, half the guest's memory.
	DiskSize int64 `json:"disk_size,omitempty"`
	// TmpSize is the size in bytes of each of the /tmp and /dev/shm tmpfs mounts:
	// roche.Config.TmpSize.
	TmpSize int64 `json:"tmp_size"`
	// Transport is TransportSerial or TransportVsock.
	Transport string `json:"transport"`
	// EgressListen, when set, is the loopback address (egress.SandboxListen) where the
	// agent accepts the sandbox's HTTP proxy connections and carries each, as a stream
	// it opens over the serial link, to the host, which hands it to the sandbox's
	// egress proxy. The VM has no network device either way.
	EgressListen string `json:"egress_listen,omitempty"`
	// TrustFiles are files the agent covers, read-only, in the sandbox's root: the
	// egress CA's certificate and the trust store holding it (egress.Trust's files).
	TrustFiles []TrustFile `json:"trust_files,omitempty"`
}

// TrustFile is a file of the sandbox's root (Path, absolute) that the agent covers with
// Content, read-only.
type TrustFile struct {
	Path    string `json:"path"`
	Content []byte `json:"content"`
}

// MuxConfig is the yamux configuration both ends of the serial link use.
func MuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	// The link is a local pipe into one VM: its death shows as EOF, and a keepalive
	// missed while the VM is paused (or slow under emulation) must not kill every stream.
	c.EnableKeepAlive = false
	// A stream whose SYN is not answered within the default 75 s would close the whole
	// session; a slow guest is not a dead one.
	c.StreamOpenTimeout = 0
	// Writes wait while a VM is paused; only give up on a wedged guest, not a paused one.
	c.ConnectionWriteTimeout = 10 * time.Minute
	// Larger windows cut the round trips of big transfers over a slow emulated device.
	c.MaxStreamWindowSize = 1 << 20
	c.LogOutput = io.Discard
	return c
}

// ReadHello reads the guest's hello line byte by byte (so nothing past it is consumed)
// and checks it.
func ReadHello(r io.Reader) error {
	var line []byte
	b := make([]byte, 1)
	for len(line) < 64 {
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("reading the agent's hello: %w", err)
		}
		line = append(line, b[0])
		if b[0] == '\n' {
			break
		}
	}
	if string(line) != Hello {
		return fmt.Errorf("the VM agent greeted with %q, want %q: the host and guest roche-agent differ", line, Hello)
	}
	return nil
}

// DialHybridVsock connects to a guest vsock port through Firecracker's host-side unix
// socket. (The SDK's vsock.Dial waits a retry interval before its first attempt, which
// would add 100 ms to every operation.)
func DialHybridVsock(ctx context.Context, udsPath string, port uint32) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", udsPath)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		c.Close()
		return nil, fmt.Errorf("vsock CONNECT to port %d: %w", port, err)
	}
	// The reply is one short line; read it without buffering past it. One that has not
	// ended within 64 bytes is not the reply, whatever it starts with.
	var line []byte
	b := make([]byte, 1)
	ended := false
	for len(line) < 64 {
		if _, err := io.ReadFull(c, b); err != nil {
			c.Close()
			return nil, fmt.Errorf("vsock CONNECT to port %d: no acknowledgement (is the guest agent up?): %w", port, err)
		}
		if b[0] == '\n' {
			ended = true
			break
		}
		line = append(line, b[0])
	}
	f := strings.Fields(string(line))
	if !ended || len(f) != 2 || f[0] != "OK" {
		c.Close()
		return nil, fmt.Errorf("vsock CONNECT to port %d: unexpected reply %q", port, line)
	}
	if _, err := strconv.ParseUint(f[1], 10, 32); err != nil {
		c.Close()
		return nil, fmt.Errorf("vsock CONNECT to port %d: unexpected reply %q", port, line)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}
