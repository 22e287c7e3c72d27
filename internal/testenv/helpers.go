package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// RunWithAgent is a TestMain's body for packages that make sandboxes running roche-agent:
// it builds the agent (SetupAgent), runs the tests, and fails a passing run that left a
// goroutine behind (every create, exec, copy and destroy must let go of its own). It
// returns the exit code.
func RunWithAgent(m *testing.M) int {
	cleanup, err := SetupAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	cleanup()
	return NoLeaks(code)
}

// NoLeaks turns a passing code into a failing one when goroutines were left running.
func NoLeaks(code int) int {
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			return 1
		}
	}
	return code
}

// Eventually polls cond until it holds, failing the test after d.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SyncBuffer collects a log, safe to read while it is written, and lets a test wait for
// a line in it (Await): a process's readiness line is the signal to go on, not a sleep.
type SyncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and replaced at each write
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written != nil {
		close(s.written)
		s.written = nil
	}
	return s.b.Write(p)
}

// Await waits until the log holds substr, and reports whether it came. It gives up
// when stop is closed (the process writing the log exited; nil never closes) or after
// d, failing then with the log so far.
func (s *SyncBuffer) Await(t testing.TB, substr string, stop <-chan struct{}, d time.Duration) bool {
	t.Helper()
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	for {
		s.mu.Lock()
		if bytes.Contains(s.b.Bytes(), []byte(substr)) {
			s.mu.Unlock()
			return true
		}
		if s.written == nil {
			s.written = make(chan struct{})
		}
		written := s.written
		s.mu.Unlock()
		select {
		case <-written:
		case <-stop:
			// What it wrote last may be the line.
			return strings.Contains(s.String(), substr)
		case <-timeout.C:
			t.Fatalf("no %q in %v; the log so far:\n%s", substr, d, s.String())
		}
	}
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// SilentSocket listens on a unix socket at path that accepts connections and never
// answers, as a frozen or wedged engine does, until the test ends.
func SilentSocket(t testing.TB, path string) string {
	t.Helper()
	path, _ = SilentSocketAccepting(t, path)
	return path
}

// SilentSocketAccepting is SilentSocket, and a channel that gets a value for each
// connection it accepts (the first 64 not taken are kept): the signal that a client has
// reached it.
func SilentSocketAccepting(t testing.TB, path string) (string, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	accepted := make(chan struct{}, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return path, accepted
}

// ShortDir is a temporary directory with a short path, removed at the end of the test:
// a unix socket's path must fit in 108 bytes, which t.TempDir under a long test name may
// not.
func ShortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
