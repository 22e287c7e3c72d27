package server

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/roche-sandbox/roche/internal/guest/internal/splice"
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
		// The sandbox's code makes these connections at will, and the agent's log is the
		// container's log on a node's disk: one line a minute, however many fail.
		if n, ok := s.egressFailures.note(time.Now()); ok {
			s.log.Warn("egress proxy unreachable", "err", err, "failures", n)
		}
		body := "roche egress: the host's proxy is not reachable (is the process that created this sandbox still running?)\n"
		fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		return
	}
	splice.Join(c, up)
}

// everyMinute lets one report through a minute and counts the events in between.
type everyMinute struct {
	mu     sync.Mutex
	last   time.Time
	missed int
}

// note counts an event and reports whether to report it now, with the events since the
// last report (this one included).
func (e *everyMinute) note(now time.Time) (int, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.missed++
	if !e.last.IsZero() && now.Sub(e.last) < time.Minute {
		return 0, false
	}
	n := e.missed
	e.last, e.missed = now, 0
	return n, true
}
