package roche

import (
	"bytes"
	"io"
	"sync"
)

// OutputCapture keeps up to a limit of one stream's bytes, optionally passing them on to
// a live sink as they arrive, and records whether anything was cut. Past the limit it
// keeps accepting (and discarding) writes so the producer never blocks on a full pipe.
// It is safe for concurrent use.
type OutputCapture struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	limit     int64
	sink      io.Writer
	truncated bool
	// streamOnly: bytes within the limit go to the sink and are counted, not kept.
	streamOnly bool
	passed     int64
}

// NewOutputCapture returns a capture that keeps limit bytes (DefaultOutputLimit when
// limit <= 0) and copies them to sink when sink is not nil.
func NewOutputCapture(limit int64, sink io.Writer) *OutputCapture {
	if limit <= 0 {
		limit = DefaultOutputLimit
	}
	return &OutputCapture{limit: limit, sink: sink}
}

// Write implements io.Writer. It never fails: a failing sink (a closed terminal) is
// dropped so that capture goes on.
func (c *OutputCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	room := c.limit - c.passed
	if int64(len(p)) > room {
		p = p[:max(room, 0)]
		c.truncated = true
	}
	if len(p) > 0 {
		c.passed += int64(len(p))
		if !c.streamOnly {
			c.buf.Write(p)
		}
		if c.sink != nil {
			if _, err := c.sink.Write(p); err != nil {
				c.sink = nil
			}
		}
	}
	return n, nil
}

// Captures returns the captures of a request's stdout and stderr: each keeps up to
// OutputLimit bytes and passes them on to the request's sink, or with StreamOnly only
// passes them on.
func (r ExecRequest) Captures() (stdout, stderr *OutputCapture) {
	stdout = NewOutputCapture(r.OutputLimit, r.Stdout)
	stderr = NewOutputCapture(r.OutputLimit, r.Stderr)
	stdout.streamOnly = r.StreamOnly && r.Stdout != nil
	stderr.streamOnly = r.StreamOnly && r.Stderr != nil
	return stdout, stderr
}

// String returns the captured bytes.
func (c *OutputCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// Truncated reports whether bytes past the limit were discarded.
func (c *OutputCapture) Truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.truncated
}
