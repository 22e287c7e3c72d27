package server_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/server"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// leasedServer runs an agent with a lease (first, grace) on a socket of its own and
// returns its client and a channel that receives when Run returns.
func leasedServer(t *testing.T, first, grace time.Duration) (*guest.Client, <-chan time.Time, context.CancelFunc) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	srv, err := server.New(server.Config{
		Socket: sock, User: fmt.Sprintf("%d:%d", sandboxUser, sandboxUser),
		LeaseGrace: grace, FirstLease: first,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan time.Time, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Run(ctx); err != nil {
			t.Errorf("agent: %v", err)
		}
		stopped <- time.Now()
	}()
	t.Cleanup(func() { cancel(); <-done })
	c := guest.NewClient(sock)
	if err := c.WaitReady(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	return c, stopped, cancel
}

// stoppedWithin fails unless the agent stopped between lo and hi after since.
func stoppedWithin(t *testing.T, stopped <-chan time.Time, since time.Time, lo, hi time.Duration, what string) {
	t.Helper()
	select {
	case at := <-stopped:
		if el := at.Sub(since); el < lo {
			t.Fatalf("%s: the agent stopped after %v, before %v", what, el, lo)
		}
	case <-time.After(hi):
		t.Fatalf("%s: the agent still runs %v later", what, hi)
	}
}

// TestLeaseNeverTaken: a leased sandbox whose creator died before taking the lease stops
// once the first lease is overdue.
func TestLeaseNeverTaken(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	start := time.Now()
	_, stopped, _ := leasedServer(t, time.Second, 200*time.Millisecond)
	stoppedWithin(t, stopped, start, 900*time.Millisecond, 5*time.Second, "no lease taken")
}

// TestLeaseHeldAndLost: while a holder keeps its connection, the sandbox runs past every
// deadline; a second holder going changes nothing; when the last goes (as a killed
// process's connections do), it stops after the grace.
func TestLeaseHeldAndLost(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	c, stopped, _ := leasedServer(t, 500*time.Millisecond, 300*time.Millisecond)
	a, err := c.Lease(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Lease(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	select {
	case <-stopped:
		t.Fatal("the agent stopped while a holder kept its lease")
	case <-time.After(1500 * time.Millisecond):
	}
	if _, err := c.Health(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("a held sandbox does not answer: %v", err)
	}
	lost := time.Now()
	a.Close()
	stoppedWithin(t, stopped, lost, 250*time.Millisecond, 5*time.Second, "lease lost")
}

// TestLeaseKept: a sandbox whose lease was ended (roche create through a pool) no longer
// stops when its holders go, and refuses new leases.
func TestLeaseKept(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	c, stopped, cancel := leasedServer(t, 500*time.Millisecond, 200*time.Millisecond)
	l, err := c.Lease(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Keep(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	l.Close()
	select {
	case <-stopped:
		t.Fatal("a kept sandbox stopped when its lease holder went")
	case <-time.After(time.Second):
	}
	var ae *guest.Error
	if _, err := c.Lease(ctxT(t, 5*time.Second)); !errors.As(err, &ae) || ae.Code != guest.CodeUnsupported {
		t.Fatalf("a lease on a kept sandbox: %v", err)
	}
	cancel()
}

// TestLeaseRefusedWhenNotLeased: a sandbox started without a lease says so.
func TestLeaseRefusedWhenNotLeased(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	var ae *guest.Error
	if _, err := client.Lease(ctxT(t, 5*time.Second)); !errors.As(err, &ae) || ae.Code != guest.CodeUnsupported {
		t.Fatalf("a lease on a sandbox without one: %v", err)
	}
}
