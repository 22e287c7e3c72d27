package vmlink

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// RelinkLine is what the host writes on the serial port to a guest that was told a
// snapshot is coming (guest.OpSnapshotPrepare, with Nonce): the guest then greets with
// Hello again and a new multiplexer session starts. The nonce, fresh per snapshot and
// never shown to the sandbox, keeps data that happens to hold the words from relinking.
func RelinkLine(nonce string) []byte { return []byte("\nroche-vmlink relink " + nonce + "\n") }

// Switch carries successive multiplexer sessions over one byte stream (the serial port,
// or the host's end of it): one goroutine reads the stream and hands what it reads to
// the current session's Conn, or, after Expect, watches for a marker (the guest's Hello
// on the host side, the host's RelinkLine on the guest side) that says the other end
// starts a new session. Without it, a session being given up would go on reading, and
// take the new session's first bytes. A VM restored from a snapshot reaches its host
// over a new link while its guest still holds the old session's state: this is how both
// ends agree where the new session starts.
type Switch struct {
	r io.Reader
	w io.Writer
	// retryEOF makes end of stream while watching for a marker a pause, not the end:
	// a guest's virtio port reads end of stream while no host is connected (a VM being
	// restored), and a host connects again.
	retryEOF bool

	wmu sync.Mutex // orders writes from the sessions and the switch

	mu      sync.Mutex
	cur     *switchConn
	marker  []byte
	window  []byte        // the end of what was read while watching, for a marker split across reads
	found   chan struct{} // closed once the marker was read
	pending []byte        // read after the marker, before the next Conn
	err     error         // the stream's read error: everything ends
	ended   chan struct{}
}

// NewSwitch starts reading rw. Until Expect or Conn, what it reads is dropped.
func NewSwitch(r io.Reader, w io.Writer, retryEOF bool) *Switch {
	s := &Switch{r: r, w: w, retryEOF: retryEOF, ended: make(chan struct{})}
	go s.pump()
	return s
}

// Ended is closed once the stream cannot be read any more.
func (s *Switch) Ended() <-chan struct{} { return s.ended }

// Write writes to the stream between sessions (a hello, a relink line).
func (s *Switch) Write(b []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.w.Write(b)
	return err
}

// Expect makes the switch watch for marker. What is read before the marker still goes to
// the current Conn (the other end may still be using that session); the marker's arrival
// ends that Conn and closes the returned channel, and what follows it waits for the
// next Conn.
func (s *Switch) Expect(marker []byte) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.marker = append([]byte(nil), marker...)
	s.window = nil
	s.found = make(chan struct{})
	return s.found
}

// Drop ends the current Conn: its reads end, its writes fail, so a session over it ends
// and writes nothing more into the stream.
func (s *Switch) Drop() {
	s.mu.Lock()
	c := s.cur
	s.cur = nil
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Conn drops the current Conn and returns a new one, which reads from the marker on.
func (s *Switch) Conn() io.ReadWriteCloser {
	s.Drop()
	pr, pw := io.Pipe()
	c := &switchConn{s: s, pr: pr, pw: pw}
	s.mu.Lock()
	c.head, s.pending = s.pending, nil
	if s.err != nil {
		pw.CloseWithError(s.err)
	}
	s.cur = c
	s.mu.Unlock()
	return c
}

func (s *Switch) pump() {
	defer close(s.ended)
	buf := make([]byte, 32<<10)
	for {
		n, err := s.r.Read(buf)
		if n > 0 {
			s.deliver(buf[:n])
		}
		if err != nil {
			s.mu.Lock()
			watching := s.marker != nil
			s.mu.Unlock()
			if errors.Is(err, io.EOF) && s.retryEOF && watching {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			s.mu.Lock()
			s.err = err
			c := s.cur
			s.mu.Unlock()
			if c != nil {
				c.pw.CloseWithError(err)
			}
			return
		}
	}
}

// deliver hands one read to the current Conn, splitting it at the marker when one is
// awaited.
func (s *Switch) deliver(b []byte) {
	s.mu.Lock()
	cur := s.cur
	if s.marker == nil {
		if cur == nil {
			s.pending = append(s.pending, b...)
			if len(s.pending) > 1<<20 {
				s.pending = nil // nobody is reading: the other end is not speaking to us
			}
		}
		s.mu.Unlock()
		if cur != nil {
			_, _ = cur.pw.Write(b)
		}
		return
	}
	keep := len(s.window)
	s.window = append(s.window, b...)
	i := bytes.Index(s.window, s.marker)
	if i < 0 {
		if over := len(s.window) - (len(s.marker) - 1); over > 0 {
			s.window = append(s.window[:0], s.window[over:]...)
		}
		s.mu.Unlock()
		if cur != nil {
			_, _ = cur.pw.Write(b)
		}
		return
	}
	before := max(i-keep, 0)
	after := append([]byte(nil), s.window[i+len(s.marker):]...)
	s.marker, s.window = nil, nil
	close(s.found)
	s.pending = after
	// What follows the marker is the next session's: the one before it ends here.
	s.cur = nil
	s.mu.Unlock()
	if cur != nil {
		if before > 0 {
			_, _ = cur.pw.Write(b[:before])
		}
		cur.Close()
	}
}

// switchConn is one session's view of the stream.
type switchConn struct {
	s    *Switch
	pr   *io.PipeReader
	pw   *io.PipeWriter
	head []byte // read before this Conn existed; only Read touches it
	once sync.Once
	mu   sync.Mutex
	dead bool
}

func (c *switchConn) Read(b []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(b, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.pr.Read(b)
}

func (c *switchConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	dead := c.dead
	c.mu.Unlock()
	if dead {
		return 0, io.ErrClosedPipe
	}
	c.s.wmu.Lock()
	defer c.s.wmu.Unlock()
	// Checked again under the write lock: a dropped session must not write after the
	// switch has written a hello or relink line.
	c.mu.Lock()
	dead = c.dead
	c.mu.Unlock()
	if dead {
		return 0, io.ErrClosedPipe
	}
	return c.s.w.Write(b)
}

func (c *switchConn) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		c.dead = true
		c.mu.Unlock()
		c.pr.Close()
		c.pw.Close()
		c.s.mu.Lock()
		if c.s.cur == c {
			c.s.cur = nil
		}
		c.s.mu.Unlock()
	})
	return nil
}

// ScanHello is ReadHello for a link that may carry a dropped session's last bytes
// before the hello (a restored VM's): it waits, at most d, for the Switch to read Hello.
func ScanHello(found <-chan struct{}, ended <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-found:
		return nil
	case <-ended:
		return fmt.Errorf("reading the agent's hello: the link ended")
	case <-t.C:
		return fmt.Errorf("the VM agent did not greet within %v", d)
	}
}
