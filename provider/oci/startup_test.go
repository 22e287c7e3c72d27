package oci_test

import (
	"context"
	"errors"
	"testing"

	"github.com/roche-sandbox/roche"
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
