package docker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche/provider/internal/engine"
)

// TestDestroyWaitsForTheEnginesRemoval: a destroy that finds the engine already removing
// the sandbox (its lifetime's auto-remove, another destroy, an engine cleaning up after a
// restart) returns once the container is gone, not at once: the engine's own removal can
// fail and leave a "dead" container that nothing else would remove. The sandbox writes
// 100,000 files to its root first, which the engine takes seconds to delete.
func TestDestroyWaitsForTheEnginesRemoval(t *testing.T) {
	p := newProvider(t)
	cfg := testConfig()
	cfg.Writable, cfg.Disk, cfg.User = true, "0", "0"
	id := sandbox(t, p, cfg)
	execOK(t, p, id, "python3", "-c", `
import os
os.mkdir("/many")
for i in range(100000):
    open("/many/%d" % i, "w").close()
`)

	ctx := context.Background()
	dc := engineClient(t)
	first := make(chan error, 1)
	go func() { first <- p.Destroy(ctx, id) }()
	eventuallyStatus(t, dc, id, "removing", 20*time.Second)
	began := time.Now()

	// One with too little time says the engine is still at it, and does not call an
	// engine that answers one that does not.
	short, cancel := context.WithTimeout(ctx, time.Second)
	err := p.Destroy(short, id)
	cancel()
	var notAnswering *engine.NotAnsweringError
	switch st := containerStatus(dc, id); {
	case err == nil && st == "gone":
		t.Logf("the engine removed the sandbox within the short destroy's second")
	case err == nil || !strings.Contains(err.Error(), "still removing it") || errors.As(err, &notAnswering):
		t.Errorf("a destroy with a second while the engine removes the sandbox: %v (the container: %s), want an error saying the engine is still removing it", err, st)
	default:
		t.Logf("a destroy with a second: %v", err)
	}

	err = p.Destroy(ctx, id)
	st := containerStatus(dc, id)
	t.Logf("the second destroy returned %v after the engine began removing: %v; the container: %s", time.Since(began).Round(time.Millisecond), err, st)
	if err != nil || st != "gone" {
		t.Errorf("a destroy while the engine was removing the sandbox returned %v with the container %s, want nil once it is gone", err, st)
	}
	select {
	case err := <-first:
		if err != nil {
			t.Errorf("the first destroy: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the first destroy had not returned a minute after the second")
	}
}

// containerStatus is the engine's status of container id, "gone" once it is removed.
func containerStatus(dc *client.Client, id string) string {
	c, err := dc.ContainerInspect(context.Background(), id)
	switch {
	case cerrdefs.IsNotFound(err):
		return "gone"
	case err != nil:
		return fmt.Sprintf("unknown (%v)", err)
	case c.State == nil:
		return "unknown (no state)"
	}
	return c.State.Status
}

func eventuallyStatus(t *testing.T, dc *client.Client, id, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := containerStatus(dc, id)
		if st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox is %s after %v, want %s", st, d, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
