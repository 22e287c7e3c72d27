package engine

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// silentSocket accepts connections and never answers, as a frozen engine does.
func silentSocket(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "engine.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return path
}

// TestBoundNamesTheEngine: a Docker client call to an engine that never answers ends at
// the bound with the one-line error naming the engine, which is ErrUnavailable.
func TestBoundNamesTheEngine(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+silentSocket(t))
	cli, err := DockerClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e := Engine{Name: "the Docker engine", Addr: cli.DaemonHost(), Hint: "check dockerd"}
	start := time.Now()
	ctx, done := e.Bound(context.Background(), "listing sandboxes", 300*time.Millisecond)
	_, err = cli.Ping(ctx)
	done(&err)
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("the bound of 300ms took %v", el)
	}
	var na *NotAnsweringError
	if !errors.As(err, &na) || !errors.Is(err, roche.ErrUnavailable) {
		t.Fatalf("err %v (%T), want a NotAnsweringError", err, err)
	}
	msg := err.Error()
	for _, want := range []string{"the Docker engine at unix://", "is not answering", "listing sandboxes got no reply within 300ms", "check dockerd"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("not one line: %q", msg)
	}
}

// TestBoundLeavesCancellation: the caller's own cancellation (a signal) is not reported as
// an engine that does not answer, and ends the call at once.
func TestBoundLeavesCancellation(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+silentSocket(t))
	cli, err := DockerClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	parent, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	ctx, done := Engine{Name: "the Docker engine"}.Bound(parent, "creating a sandbox", time.Minute)
	_, err = cli.Ping(ctx)
	done(&err)
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("a cancelled call took %v", el)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

// TestCallReturnsAtTheDeadline: a call that stops watching ctx still returns at its end,
// and a result that comes later is discarded.
func TestCallReturnsAtTheDeadline(t *testing.T) {
	release := make(chan struct{})
	discarded := make(chan int, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := Call(ctx, func() (int, error) { <-release; return 7, nil }, func(v int) { discarded <- v })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the deadline", err)
	}
	close(release)
	select {
	case v := <-discarded:
		if v != 7 {
			t.Fatalf("discarded %d", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the late result was not discarded")
	}
}
