package server

import (
	"fmt"
	"net"
	"os"
	"sync"
)

// oneConn is the listener of a one-shot sandbox's agent (Config.Conn): it accepts the
// one connection it was made with, once, then nothing until it is closed. served is
// closed when that connection is, which the server does once it has served it.
type oneConn struct {
	c      net.Conn
	once   sync.Once
	served chan struct{}
	closed chan struct{}
	close  sync.Once
}

func newOneConn(c net.Conn) *oneConn {
	return &oneConn{c: c, served: make(chan struct{}), closed: make(chan struct{})}
}

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = &servedConn{Conn: l.c, served: l.served} })
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error {
	l.close.Do(func() { close(l.closed) })
	return nil
}

func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// servedConn tells its listener when the server is done with it.
type servedConn struct {
	net.Conn
	once   sync.Once
	served chan struct{}
}

func (c *servedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.served) })
	return err
}

// connFromFD is the connection on inherited descriptor fd (Config.ConnFD).
func connFromFD(fd int) (net.Conn, error) {
	if fd < 3 {
		return nil, fmt.Errorf("connection descriptor %d: give one past the standard streams (3 or more)", fd)
	}
	f := os.NewFile(uintptr(fd), "conn")
	defer f.Close() // FileConn holds a copy
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("connection descriptor %d: not a connected socket: %w", fd, err)
	}
	return c, nil
}
