package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// vsockListener is an AF_VSOCK listener. The standard library's net package does not know
// the family, so the socket is driven through os.File, which still gives accept and I/O
// the runtime's poller (no thread blocked per connection).
type vsockListener struct {
	f    *os.File
	port uint32
}

func listenVsock(port uint32) (net.Listener, error) {
	if err := waitFor("/dev/vsock", 10*time.Second); err != nil {
		return nil, fmt.Errorf("no vsock device: the VM was started without one: %w", err)
	}
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding vsock port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listening on vsock port %d: %w", port, err)
	}
	return &vsockListener{f: os.NewFile(uintptr(fd), "vsock"), port: port}, nil
}

func (l *vsockListener) Accept() (net.Conn, error) {
	rc, err := l.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var aerr error
	if err := rc.Read(func(fd uintptr) bool {
		nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		return !errors.Is(aerr, syscall.EAGAIN)
	}); err != nil {
		return nil, err
	}
	if aerr != nil {
		return nil, aerr
	}
	return &vsockConn{File: os.NewFile(uintptr(nfd), "vsock-conn"), local: vsockAddr(l.port)}, nil
}

func (l *vsockListener) Close() error   { return l.f.Close() }
func (l *vsockListener) Addr() net.Addr { return vsockAddr(l.port) }

type vsockAddr uint32

func (a vsockAddr) Network() string { return "vsock" }
func (a vsockAddr) String() string  { return "vsock:" + strconv.Itoa(int(a)) }

// vsockConn is a connection accepted on a vsockListener.
type vsockConn struct {
	*os.File
	local vsockAddr
}

func (c *vsockConn) LocalAddr() net.Addr  { return c.local }
func (c *vsockConn) RemoteAddr() net.Addr { return vsockAddr(0) }
