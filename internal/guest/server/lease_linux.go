package server

import (
	"sync"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
)

// leases stops a leased sandbox once nobody holds its lease: its creator (roche run, an
// SDK through roched, roched for its pools) holds a connection open for as long as it
// wants the sandbox, so a creator killed outright leaves a sandbox that stops within the
// grace instead of at the end of its lifetime.
type leases struct {
	grace time.Duration
	lost  chan struct{} // closed once the lease is lost

	mu    sync.Mutex
	held  int
	kept  bool // the lease was ended (agent.Request.Keep): the sandbox lives out its lifetime
	gone  bool // lost has been closed
	timer *time.Timer
}

// newLeases starts with no holder: the first must come within first.
func newLeases(first, grace time.Duration) *leases {
	l := &leases{grace: grace, lost: make(chan struct{})}
	l.timer = time.AfterFunc(first, l.expire)
	return l
}

func (l *leases) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == 0 && !l.kept && !l.gone {
		l.gone = true
		close(l.lost)
	}
}

// hold counts a holder in; it reports false when the lease is already lost (the sandbox is
// stopping) or was ended.
func (l *leases) hold() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone || l.kept {
		return false
	}
	l.held++
	l.timer.Stop()
	return true
}

// release counts a holder out; the last one out starts the grace.
func (l *leases) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held--
	if l.held == 0 && !l.kept && !l.gone {
		l.timer.Reset(l.grace)
	}
}

// keep ends the lease for good.
func (l *leases) keep() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.kept = true
	l.timer.Stop()
}

// lease serves agent.OpLease: it answers, then holds the lease until the client closes
// the connection (or the sandbox stops).
func (s *Server) lease(c *conn, req guest.Request) error {
	l := s.leases
	if l == nil {
		return &guest.Error{Code: guest.CodeUnsupported, Message: "this sandbox was not started with a lease: it lives out its lifetime"}
	}
	if req.Keep {
		l.keep()
		return c.sendJSON(guest.FrameReply, struct{}{})
	}
	if !l.hold() {
		l.mu.Lock()
		kept := l.kept
		l.mu.Unlock()
		if kept {
			return &guest.Error{Code: guest.CodeUnsupported, Message: "this sandbox's lease was ended: it lives out its lifetime"}
		}
		return &guest.Error{Code: guest.CodeNotFound, Message: "this sandbox's lease was lost and it is stopping"}
	}
	defer l.release()
	if err := c.sendJSON(guest.FrameReply, struct{}{}); err != nil {
		return nil
	}
	// The client sends nothing more: a read returns when it closes the connection.
	for {
		if _, _, err := c.read(); err != nil {
			return nil
		}
	}
}
