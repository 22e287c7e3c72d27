package oci_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/oci"
)

// TestFirstCreate: a process's first create resolves the runtime and looks the image up
// side by side (runtimeAndImage). An image the engine does not have is the error then,
// not the lookup's cancellation, and the runtime resolved beside it serves the next
// create, which makes a sandbox.
func TestFirstCreate(t *testing.T) {
	p, _ := newProvider(t, oci.WithRuntime(oci.RuntimeCrun))
	ctx := context.Background()
	missing := testConfig()
	missing.Image = "roche-test/no-such-image:none"
	if _, err := p.Create(ctx, missing); !errors.Is(err, roche.ErrImageNotFound) {
		t.Fatalf("a first create of an image the engine lacks: %v, want ErrImageNotFound", err)
	}
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"true"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
}

// TestImageMovedSinceUnpacked: a process's first create of an image name goes ahead with
// the image unpacked under that name before, beside the engine's lookup, and a name that
// names another image since is honoured: the sandbox is made again from the image it
// names now (a small one with a file the first lacks), whose files the sandbox has.
func TestImageMovedSinceUnpacked(t *testing.T) {
	p, state := newProvider(t)
	ctx := context.Background()
	tag, untag, err := testenv.PrivateImage(ctx, "moved")
	if err != nil {
		t.Fatal(err)
	}
	defer untag()
	cfg := testConfig()
	cfg.Image = tag
	first, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, first.ID); err != nil {
		t.Fatal(err)
	}

	// The name now names an image of one file.
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "moved", Mode: 0o644, Size: 2})
	tw.Write([]byte("b\n"))
	tw.Close()
	rc, err := cli.ImageImport(ctx, image.ImportSource{Source: &layer, SourceName: "-"}, tag, image.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, rc)
	rc.Close()
	moved, err := cli.ImageInspect(ctx, tag)
	if err != nil {
		t.Fatal(err)
	}
	movedID := strings.TrimPrefix(moved.ID, "sha256:")
	defer os.RemoveAll(filepath.Join("/var/lib/roche-test/oci/images", movedID))

	other, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	info, err := other.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Destroy(ctx, info.ID)
	if _, err := other.Stat(ctx, info.ID, "/moved"); err != nil {
		t.Errorf("the sandbox made after the name moved lacks the file of the image it names now: %v", err)
	}
	record, err := os.ReadFile(filepath.Join(state, info.ID, "record.json"))
	if err != nil || !strings.Contains(string(record), movedID) {
		t.Errorf("the sandbox's record does not name the image the name names now (%s): %s %v", movedID, record, err)
	}
}
