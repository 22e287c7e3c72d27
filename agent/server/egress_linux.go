package server

import (
	"fmt"
	"net"

	"github.com/roche-sandbox/roche/agent/internal/splice"
)

// serveEgress is the sandbox end of the egress allowlist: programs inside reach it as
// HTTP_PROXY on loopback (the sandbox has no other interface), and each connection is
// relayed as it is, over the control channel, to the proxy on the host, which decides.
// Nothing is filtered here, where untrusted code could interfere with it.
func (s *Server) serveEgress(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go s.forwardEgress(c)
	}
}

func (s *Server) forwardEgress(c net.Conn) {
	defer c.Close()
	up, err := s.cfg.EgressDial()
	if err != nil {
		s.log.Warn("egress proxy unreachable", "err", err)
		body := "roche egress: the host's proxy is not reachable (is the process that created this sandbox still running?)\n"
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		return
	}
	splice.Join(c, up)
}
