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
// the Pod network: each of the agent's connections (one per operation, see package agent)
// is one pods/exec of "roche-agent relay", which copies its stdin to the agent's socket
// and the socket to its stdout. The relay runs as root, like the agent, and is started by
// the container runtime, never by the sandbox's code, which runs as another uid without
// capabilities and cannot open the socket (mode 0600 in a 0700 directory, both root's).
package podlink

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
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
	// ImageAgent is the agent's path in the agent image, which holds nothing else.
	ImageAgent = "/roche-agent"
	// InstallArg and RelayArg are roche-agent's first argument in its two Pod modes.
	InstallArg = "install"
	RelayArg   = "relay"
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
