package server

import (
	"sync"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
)

// lifetime ends the sandbox at its deadline, which OpLifetime moves (roche.LifetimeSetter:
// set_timeout in the SDKs).
type lifetime struct {
	start time.Time
	over  chan struct{} // closed at the deadline

	mu       sync.Mutex
	deadline time.Time
	timer    *time.Timer
	ended    bool
}

func newLifetime(d time.Duration) *lifetime {
	l := &lifetime{start: time.Now(), over: make(chan struct{})}
	l.deadline = l.start.Add(d)
	l.timer = time.AfterFunc(d, l.end)
	return l
}

func (l *lifetime) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		close(l.over)
	}
}

// set moves the deadline to d from now; false once the lifetime has ended.
func (l *lifetime) set(d time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return false
	}
	l.timer.Stop()
	l.deadline = time.Now().Add(d)
	l.timer = time.AfterFunc(d, l.end)
	return true
}

// length is how long the sandbox was to live, from its start to its deadline.
func (l *lifetime) length() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline.Sub(l.start).Round(time.Second)
}

func (l *lifetime) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer.Stop()
}

// maxLifetimeMS is roche.MaxTimeoutSecs: the agent keeps to the product's maximum itself.
const maxLifetimeMS = 24 * 60 * 60 * 1000

// setLifetime serves guest.OpLifetime.
func (s *Server) setLifetime(req guest.Request) error {
	if s.life == nil {
		return &guest.Error{Code: guest.CodeUnsupported, Message: "this sandbox's agent was started without a lifetime: its host ends it"}
	}
	if req.LifetimeMS <= 0 || req.LifetimeMS > maxLifetimeMS {
		return invalid("lifetime_ms %d: give 1 to %d milliseconds", req.LifetimeMS, int64(maxLifetimeMS))
	}
	if !s.life.set(time.Duration(req.LifetimeMS) * time.Millisecond) {
		return &guest.Error{Code: guest.CodeNotFound, Message: "this sandbox's lifetime has ended and it is stopping"}
	}
	return nil
}
