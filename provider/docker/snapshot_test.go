package docker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
)

// Snapshots as every provider has them are checked by the conformance suite
// (providertest); these are the Docker-specific parts.

// TestSnapshotImage: a snapshot is a labelled image; /tmp, which the commit cannot see,
// comes back, owned by the new sandbox's user; the proxy settings the image kept are
// blanked.
func TestSnapshotImage(t *testing.T) {
	p := newProvider(t, docker.WithDataDir(t.TempDir()))
	ctx := context.Background()
	name := fmt.Sprintf("test-%d", time.Now().UnixNano()%1e9)
	removeAtEnd(t, "snapshot", p.RemoveSnapshot, name)

	cfg := testConfig()
	src := sandbox(t, p, cfg)
	execOK(t, p, src, "sh", "-c", "mkdir -p /tmp/d && echo in tmp > /tmp/d/tmp.txt")
	if _, err := p.Snapshot(ctx, src, name); err != nil {
		t.Fatal(err)
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	img, err := cli.ImageInspect(ctx, "roche-snapshot:"+name)
	if err != nil {
		t.Fatalf("the snapshot's image: %v", err)
	}
	if l := img.Config.Labels; l[docker.LabelSnapshot] != name || l[docker.LabelSnapshotBase] != cfg.Image {
		t.Fatalf("snapshot image labels %v, want %s=%s and %s=%s", l, docker.LabelSnapshot, name, docker.LabelSnapshotBase, cfg.Image)
	}

	from := testConfig()
	from.FromSnapshot = name
	dst := sandbox(t, p, from)
	got := execOK(t, p, dst, "sh", "-c", "cat /tmp/d/tmp.txt; [ $(stat -c %u /tmp/d/tmp.txt) = $(id -u) ] && echo mine; echo \"[$HTTP_PROXY]\"")
	if got != "in tmp\nmine\n[]\n" {
		t.Fatalf("sandbox from the snapshot sees %q", got)
	}
	// A snapshot of a snapshot's sandbox names where it came from.
	second := name + "-2"
	removeAtEnd(t, "snapshot", p.RemoveSnapshot, second)
	snap, err := p.Snapshot(ctx, dst, second)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Image != name+" (snapshot)" {
		t.Fatalf("snapshot of a sandbox from snapshot %s: image %q", name, snap.Image)
	}
}

// TestSnapshotNeedsAgent: without roche-agent /tmp could not be saved, so a snapshot is
// refused rather than taken without it.
func TestSnapshotNeedsAgent(t *testing.T) {
	p := newProvider(t, docker.WithTransport(docker.TransportDockerExec), docker.WithDataDir(t.TempDir()))
	ctx := context.Background()
	name := fmt.Sprintf("test-%d", time.Now().UnixNano()%1e9)
	removeAtEnd(t, "snapshot", p.RemoveSnapshot, name)
	id := sandbox(t, p, testConfig())
	_, err := p.Snapshot(ctx, id, name)
	if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "roche-agent") {
		t.Fatalf("a snapshot without roche-agent: %v, want ErrUnsupported naming roche-agent", err)
	}
	if err := p.RemoveSnapshot(ctx, name); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("a refused snapshot was kept: removing it: %v, want ErrNotFound", err)
	}
}
