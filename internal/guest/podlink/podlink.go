// Package podlink is what roche-agent inside a Kubernetes Pod and the host agree on: where
// the agent is installed in the Pod, and how the host reaches it.
//
// No image registry is assumed, and no image is assumed to hold the agent: an init
// container from a small image holding only roche-agent runs "roche-agent install", which
// copies the binary into an emptyDir volume that the sandbox container mounts at Dir and
// makes the socket directory, root's alone. The sandbox container then runs the agent as
// its PID 1, as under Docker.
//
// The host reaches the agent through the API server only, so that it needs no route into
// the Pod network: one pods/exec of "roche-agent mux" carries a yamux session, and each of
// the agent's connections (one per operation, see package guest) is a stream of it, which
// the relay connects to the agent's socket ("roche-agent relay" relays a single
// connection over its stdin and stdout). The relay runs as root, like the agent, and is
// started by the container runtime, never by the sandbox's code, which runs as another
// uid without capabilities and cannot open the socket (mode 0600 in a 0700 directory,
// both root's).
package podlink

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"github.com/hashicorp/yamux"

	"github.com/roche-sandbox/roche/internal/guest/internal/splice"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
)

const (
	// Dir is where the agent's volume is mounted in the sandbox container.
	Dir = "/.roche"
	// Agent is the agent's path in the sandbox container.
	Agent = Dir + "/roche-agent"
	// RunDir holds the agent's socket; root's, mode 0700.
	RunDir = Dir + "/run"
	// Socket is the agent's socket.
	Socket = RunDir + "/agent.sock"
	// TerminationLog is the sandbox container's terminationMessagePath. The kubelet makes
	// that file on the node's disk, mode 0666, unbounded, and mounts it there: in RunDir,
	// root's alone, the sandbox's code cannot open it (at the default, /dev/termination-log,
	// it could fill the node's disk). The agent writes nothing to it.
	TerminationLog = RunDir + "/termination-log"
	// ImageAgent is the agent's path in the agent image, which holds nothing else.
	ImageAgent = "/roche-agent"
	// InstallArg and RelayArg are roche-agent's first argument in its two Pod modes.
	InstallArg = "install"
	RelayArg   = "relay"
	// MuxArg runs the relay for many connections over one exec stream (Mux).
	MuxArg = "mux"
	// EgressArg, after MuxArg, makes the relay carry the sandbox's egress too (Mux).
	EgressArg = "--egress"
	// EgressSocket is where the agent relays the connections programs make to its HTTP
	// proxy port when the sandbox has an egress allowlist: the relay serves it and
	// carries each connection to the host's proxy as a stream the relay opens.
	EgressSocket = RunDir + "/egress.sock"
)

// Install copies the agent binary src into dir (the init container's view of the agent
// volume) as dir/roche-agent, mode 0555, and makes dir/run, mode 0700. dir itself is made
// 0755: an emptyDir starts world-writable, and the sandbox's user must not be able to put
// anything beside the agent.
func Install(src, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("restricting %s: %w", dir, err)
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("opening the agent binary: %w", err)
	}
	defer in.Close()
	dst := filepath.Join(dir, filepath.Base(Agent))
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o555)
	if err != nil {
		return fmt.Errorf("installing the agent: %w", err)
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("installing the agent at %s: %w", dst, err)
	}
	run := filepath.Join(dir, filepath.Base(RunDir))
	if err := os.Mkdir(run, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("making the socket directory: %w", err)
	}
	if err := os.Chmod(run, 0o700); err != nil {
		return fmt.Errorf("restricting the socket directory: %w", err)
	}
	return nil
}

// Relay connects to the agent's socket and copies in to it and it to out until either
// side ends. The end of in is the end of the connection (the host closed its exec
// stream): the agent then kills a foreground command, as when a local client hangs up.
func Relay(socket string, in io.Reader, out io.Writer) error {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return fmt.Errorf("connecting to the agent: %w", err)
	}
	go func() {
		_, _ = io.Copy(c, in)
		c.Close()
	}()
	_, err = io.Copy(out, c)
	c.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Mux serves many host connections over one exec stream: in and out carry a yamux
// session (vmlink.MuxConfig, as a QEMU guest's serial link does), and each stream the
// host opens is relayed to the agent's socket as Relay relays one. An exec costs the
// API server, the kubelet and the runtime a round trip and a process start; a stream of
// an open session costs neither. Mux returns when the session ends (the host closed the
// exec stream, or its process died): every relayed connection is then closed, and the
// agent treats each as a client that hung up.
//
// With egressSocket, the relay also serves that socket, where the agent relays the
// connections of the sandbox's programs to its HTTP proxy port, and carries each to the
// host as a stream it opens: the host's egress proxy, which alone decides, answers it.
// The Pod needs no network for it. The last relay to start serves the socket (a newer
// host process took over); one that ends leaves the socket file, so the agent then
// answers 502 until a host serves it again.
func Mux(socket string, in io.Reader, out io.Writer, egressSocket string) error {
	sess, err := yamux.Server(stdio{in, out}, vmlink.MuxConfig())
	if err != nil {
		return err
	}
	defer sess.Close()
	if egressSocket != "" {
		ln, err := listenEgress(egressSocket)
		if err != nil {
			return err
		}
		defer ln.Close()
		go carryEgress(ln, sess)
	}
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if sess.IsClosed() {
				return nil
			}
			return err
		}
		go relayStream(socket, st)
	}
}

// relayStream relays one stream of a Mux session to a connection of its own to the agent.
// Unlike an exec stream, a yamux stream whose reader has gone does not fail its writer:
// the writer waits for flow-control credit. So once the agent has hung up (an upload it
// refused mid-way, ENOSPC), what the host still sends is read and dropped until the host
// closes its end, and the host hears the agent's answer instead of waiting.
func relayStream(socket string, st net.Conn) {
	defer st.Close()
	c, err := net.Dial("unix", socket)
	if err != nil {
		// Closed at once: the host reads the end and reports that the agent is not
		// answering yet.
		return
	}
	go func() {
		if _, err := io.Copy(c, st); err != nil {
			_, _ = io.Copy(io.Discard, st)
		}
		c.Close()
	}()
	_, _ = io.Copy(st, c)
	c.Close()
}

// listenEgress serves path in place of whatever was there (a relay that ended), root's
// alone as the agent's socket is; closing it leaves the file, which a newer relay may
// own by then.
func listenEgress(path string) (*net.UnixListener, error) {
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("serving the egress socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restricting the egress socket: %w", err)
	}
	return ln, nil
}

// carryEgress relays each connection the agent makes to the egress socket to a stream
// of the host's session, until the listener or the session closes.
func carryEgress(ln net.Listener, sess *yamux.Session) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		st, err := sess.OpenStream()
		if err != nil {
			c.Close()
			if sess.IsClosed() {
				return
			}
			continue
		}
		go splice.Join(c, st)
	}
}

// stdio is the exec stream's stdin and stdout as one connection for yamux.
type stdio struct {
	io.Reader
	io.Writer
}

func (stdio) Close() error { return nil }
