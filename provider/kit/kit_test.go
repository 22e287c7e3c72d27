package kit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestRetryAfter: the wait a provider or a pool puts on a refusal is what roche's
// RetryDelay reads back, through any wrapping, and the refusal keeps its sentinel.
func TestRetryAfter(t *testing.T) {
	err := fmt.Errorf("creating: %w", kit.RetryAfter(fmt.Errorf("%w: pool full", roche.ErrExhausted), 250*time.Millisecond))
	if d, ok := roche.RetryDelay(err); !ok || d != 250*time.Millisecond {
		t.Fatalf("RetryDelay = %v, %v; want 250ms", d, ok)
	}
	if !errors.Is(err, roche.ErrExhausted) || err.Error() != "creating: resource exhausted: pool full" {
		t.Fatalf("the refusal lost its sentinel or its words: %v", err)
	}
	if _, ok := roche.RetryDelay(roche.ErrExhausted); ok {
		t.Fatal("a refusal without a wait has one")
	}
}

// TestNotConfigured: a provider not set up here is ErrNotConfigured and still
// ErrUnavailable, its words unchanged; one set up that fails is only ErrUnavailable.
func TestNotConfigured(t *testing.T) {
	down := fmt.Errorf("%w: no Docker engine here", roche.ErrUnavailable)
	err := kit.NotConfigured(down)
	if !errors.Is(err, roche.ErrNotConfigured) || !errors.Is(err, roche.ErrUnavailable) || err.Error() != down.Error() {
		t.Fatalf("NotConfigured(%v) = %v", down, err)
	}
	if errors.Is(down, roche.ErrNotConfigured) {
		t.Fatal("an unavailable provider is not set up, unmarked")
	}
}

// copier is a TarCopier that is also a kit.Copier, as roched's client is.
type copier struct{ in, out int }

func (c *copier) CopyTarTo(context.Context, string, string, io.Reader) error {
	return errors.New("CopyIn streamed instead of deferring")
}

func (c *copier) CopyTarFrom(context.Context, string, string, io.Writer) error {
	return errors.New("CopyOut streamed instead of deferring")
}

func (c *copier) CopyIn(context.Context, string, string, string, roche.CopyOptions) (roche.CopyReport, error) {
	c.in++
	return roche.CopyReport{Files: 1}, nil
}

func (c *copier) CopyOut(context.Context, string, string, string, roche.CopyOptions) (roche.CopyReport, error) {
	c.out++
	return roche.CopyReport{Files: 2}, nil
}

var _ kit.Copier = (*copier)(nil)

// TestCopyDefersToCopier: roche.CopyIn and CopyOut hand a copy to a kit.Copier whole,
// so that its options reach the side that enforces them.
func TestCopyDefersToCopier(t *testing.T) {
	c := &copier{}
	ctx := context.Background()
	if rep, err := roche.CopyIn(ctx, c, "sb", t.TempDir(), "/tmp/x", roche.CopyOptions{}); err != nil || rep.Files != 1 || c.in != 1 {
		t.Fatalf("CopyIn: %+v %v (deferred %d times)", rep, err, c.in)
	}
	if rep, err := roche.CopyOut(ctx, c, "sb", "/tmp/x", t.TempDir(), roche.CopyOptions{}); err != nil || rep.Files != 2 || c.out != 1 {
		t.Fatalf("CopyOut: %+v %v (deferred %d times)", rep, err, c.out)
	}
}

// TestDefaultWorkspaceBytes: the default workspace size providers make is the one
// package roche documents.
func TestDefaultWorkspaceBytes(t *testing.T) {
	cfg := roche.DefaultConfig()
	cfg.Workspace, cfg.WorkspaceSize = "w", roche.DefaultWorkspaceSize
	if err := cfg.Validate(); err != nil || cfg.WorkspaceBytes() != kit.DefaultWorkspaceBytes {
		t.Fatalf("roche.DefaultWorkspaceSize %q is %d bytes (%v), kit.DefaultWorkspaceBytes %d",
			roche.DefaultWorkspaceSize, cfg.WorkspaceBytes(), err, kit.DefaultWorkspaceBytes)
	}
}

func TestUID(t *testing.T) {
	for user, want := range map[string]int{"1000": 1000, "1000:1000": 1000, "0:0": 0, "nobody": -1, roche.UserAuto: -1, "-5": -1, "": -1} {
		if got := kit.UID(roche.Config{User: user}); got != want {
			t.Errorf("UID(Config{User: %q}) = %d, want %d", user, got, want)
		}
	}
}
