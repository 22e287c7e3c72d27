package docker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
)

func TestSnapshotRestoresFiles(t *testing.T) {
	p := newProvider(t, docker.WithDataDir(t.TempDir()))
	ctx := context.Background()
	name := fmt.Sprintf("test-%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { p.RemoveSnapshot(context.Background(), name) })

	cfg := testConfig()
	cfg.Writable = true
	src := sandbox(t, p, cfg)
	execOK(t, p, src, "sh", "-c", "echo on the root > /var/tmp/root.txt; mkdir -p /tmp/d && echo in tmp > /tmp/d/tmp.txt")
	snap, err := p.Snapshot(ctx, src, name)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Name != name || snap.Image != cfg.Image {
		t.Fatalf("snapshot %+v", snap)
	}
	if _, err := p.Snapshot(ctx, src, name); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("a second snapshot of the same name: %v", err)
	}
	list, err := p.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range list {
		found = found || s.Name == name
	}
	if !found {
		t.Fatalf("snapshot list %+v lacks %s", list, name)
	}

	// A new sandbox from it, read-only this time, sees both files and no processes.
	from := testConfig()
	from.FromSnapshot = name
	dst := sandbox(t, p, from)
	got := execOK(t, p, dst, "sh", "-c", "cat /var/tmp/root.txt /tmp/d/tmp.txt; stat -c %U /tmp/d/tmp.txt; echo $HTTP_PROXY")
	if got != "on the root\nin tmp\nnobody\n\n" {
		t.Fatalf("sandbox from the snapshot sees %q", got)
	}
	// In use, it cannot be removed; the error says so.
	if err := p.RemoveSnapshot(ctx, name); !errors.Is(err, roche.ErrInUse) {
		t.Fatalf("removing a snapshot in use: %v, want ErrInUse", err)
	}
	p.Destroy(ctx, dst)
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := p.RemoveSnapshot(ctx, name)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removing the snapshot after its sandbox: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	from.FromSnapshot = name
	if _, err := p.Create(ctx, from); !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "snapshot") {
		t.Fatalf("create from a removed snapshot: %v", err)
	}
}
