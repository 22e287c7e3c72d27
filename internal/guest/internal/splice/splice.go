// Package splice joins two connections, for the agent's relays: the egress connection a
// program makes inside the sandbox and the one that carries it to the host.
package splice

import (
	"io"
	"net"
)

// Join copies a to b and b to a until both directions end, half-closing each side as
// its source ends (closing it where it cannot be half-closed), then closes both.
func Join(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(b, a)
		closeWrite(b)
		close(done)
	}()
	_, _ = io.Copy(a, b)
	closeWrite(a)
	<-done
	a.Close()
	b.Close()
}

// closeWrite half-closes c where it can, else closes it.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	c.Close()
}
