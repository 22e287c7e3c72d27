package kit

import (
	"bytes"
	"io"
	"slices"
	"sync"

	"github.com/roche-sandbox/roche"
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

// NewOutputCapture returns a capture that keeps limit bytes (roche.DefaultOutputLimit when
// limit <= 0) and copies them to sink when sink is not nil.
func NewOutputCapture(limit int64, sink io.Writer) *OutputCapture {
	if limit <= 0 {
		limit = roche.DefaultOutputLimit
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

// Captures returns the captures of an ExecRequest's stdout and stderr: each keeps up to
// r.OutputLimit bytes and passes them on to the request's sink, or with r.StreamOnly
// only passes them on. Exec fills its result from them.
func Captures(r roche.ExecRequest) (stdout, stderr *OutputCapture) {
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

// LogCapture keeps the chunks a cell writes to one stream, up to limit bytes in all
// (roche.DefaultOutputLimit when limit is 0), and passes each on to w when w is set.
type LogCapture struct {
	mu        sync.Mutex
	limit     int64
	n         int64
	chunks    []string
	truncated bool
	w         io.Writer
}

// NewLogCapture returns a capture of limit bytes passing chunks on to w (which may be nil).
func NewLogCapture(limit int64, w io.Writer) *LogCapture {
	if limit <= 0 {
		limit = roche.DefaultOutputLimit
	}
	return &LogCapture{limit: limit, w: w}
}

// Write keeps what fits and passes everything on.
func (c *LogCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	if room := c.limit - c.n; room < int64(len(p)) {
		c.truncated = true
		if room > 0 {
			c.chunks = append(c.chunks, string(p[:room]))
			c.n += room
		}
	} else if len(p) > 0 {
		c.chunks = append(c.chunks, string(p))
		c.n += int64(len(p))
	}
	c.mu.Unlock()
	if c.w != nil {
		return c.w.Write(p)
	}
	return len(p), nil
}

// Chunks returns the kept chunks.
func (c *LogCapture) Chunks() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.chunks)
}

// Truncated reports whether bytes past the limit were discarded.
func (c *LogCapture) Truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.truncated
}
