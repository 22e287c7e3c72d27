package egress

import (
	"sync"
	"time"
)

// Log rates per sandbox: a sandbox that loops on refused requests must not flood the
// host's logs, yet the first refusals, and how many followed, are always told.
const (
	refusedLogBurst = 20
	refusedLogEvery = time.Second
	allowedLogBurst = 50
	allowedLogEvery = 200 * time.Millisecond
)

// logLimiter is a token bucket for log lines: burst lines at once, then one per every;
// it counts the lines it drops so that the next line written can say how many.
type logLimiter struct {
	burst float64
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	tokens  float64
	last    time.Time
	dropped int
}

func newLogLimiter(burst int, every time.Duration, now func() time.Time) *logLimiter {
	return &logLimiter{burst: float64(burst), every: every, now: now, tokens: float64(burst), last: now()}
}

// take reports whether a line may be written now and, when it may, how many lines were
// dropped since the last one written.
func (l *logLimiter) take() (ok bool, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if el := now.Sub(l.last); el > 0 {
		l.tokens = min(l.burst, l.tokens+float64(el)/float64(l.every))
	}
	l.last = now
	if l.tokens < 1 {
		l.dropped++
		return false, 0
	}
	l.tokens--
	dropped, l.dropped = l.dropped, 0
	return true, dropped
}

// drain returns, and forgets, the count of lines dropped since the last one written.
func (l *logLimiter) drain() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.dropped
	l.dropped = 0
	return n
}
