package oci

import (
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// socketPair makes a one-shot sandbox's connection: this process's end, and the end
// the runtime hands the agent (not closed on exec, once it is the runtime's descriptor 3).
func socketPair() (net.Conn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	host := os.NewFile(uintptr(fds[0]), "one-shot")
	defer host.Close() // FileConn holds a copy
	agent := os.NewFile(uintptr(fds[1]), "one-shot-agent")
	c, err := net.FileConn(host)
	if err != nil {
		agent.Close()
		return nil, nil, err
	}
	return c, agent, nil
}
