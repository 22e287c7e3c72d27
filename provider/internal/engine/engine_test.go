package engine

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// silentSocket accepts connections and never answers, as a frozen engine does.
func silentSocket(t *testing.T) string {
	return testenv.SilentSocket(t, filepath.Join(t.TempDir(), "engine.sock"))
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

// TestNegotiationKeepsEachCallToItsBound: against an engine that never answers, a short
// bounded call made while a longer one is waiting for the API version to be agreed ends
// at its own bound, not at the longer one's (the Docker client's own negotiation holds a
// lock for the first caller's whole deadline).
func TestNegotiationKeepsEachCallToItsBound(t *testing.T) {
	sock, accepted := testenv.SilentSocketAccepting(t, filepath.Join(t.TempDir(), "engine.sock"))
	t.Setenv("DOCKER_HOST", "unix://"+sock)
	cli, err := DockerClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e := Engine{Name: "the Docker engine", Addr: cli.DaemonHost()}
	e.Ready = NewNegotiation(cli, e).Wait

	long := make(chan error, 1)
	go func() {
		ctx, done := e.Bound(context.Background(), "listing sandboxes", 5*time.Second)
		_, err := cli.ContainerList(ctx, container.ListOptions{})
		done(&err)
		long <- err
	}()
	<-accepted // the long call is first to ask for the version
	start := time.Now()
	ctx, done := e.Bound(context.Background(), "creating a sandbox", 500*time.Millisecond)
	_, err = cli.ContainerList(ctx, container.ListOptions{})
	done(&err)
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("a call bounded by 500ms took %v behind another's negotiation", el)
	}
	var na *NotAnsweringError
	if !errors.As(err, &na) || na.Op != "creating a sandbox" {
		t.Fatalf("the short call: %v, want a NotAnsweringError for its own operation", err)
	}
	if err := <-long; !errors.As(err, &na) {
		t.Fatalf("the long call: %v, want a NotAnsweringError", err)
	}
}

// TestNegotiationPassesRefusals: an engine that refuses connections is reported by the
// call itself, at once, as it would be without the negotiation.
func TestNegotiationPassesRefusals(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "nothing.sock"))
	cli, err := DockerClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e := Engine{Name: "the Docker engine", Addr: cli.DaemonHost()}
	e.Ready = NewNegotiation(cli, e).Wait
	start := time.Now()
	ctx, done := e.Bound(context.Background(), "listing sandboxes", 5*time.Second)
	_, err = cli.ContainerList(ctx, container.ListOptions{})
	done(&err)
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("a refused connection took %v", el)
	}
	if err == nil || !client.IsErrConnectionFailed(err) {
		t.Fatalf("a socket nobody listens on: %v, want the client's connection error", err)
	}
}
