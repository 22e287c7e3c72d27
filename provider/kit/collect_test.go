package kit_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

func TestCollect(t *testing.T) {
	now := time.Now()
	list := []roche.SandboxInfo{
		{ID: "live", ExpiresAt: now.Add(time.Hour), State: roche.StateRunning},
		{ID: "expired", ExpiresAt: now.Add(-time.Second), State: roche.StateRunning},
		{ID: "stopped", ExpiresAt: now.Add(time.Hour), State: roche.StateExited},
		{ID: "stuck", ExpiresAt: now.Add(-time.Second), State: roche.StateRunning},
	}
	var destroyed []string
	destroy := func(_ context.Context, id string) error {
		if id == "stuck" {
			return errors.New("cannot remove stuck")
		}
		destroyed = append(destroyed, id)
		return nil
	}
	ids := func(l []roche.SandboxInfo) []string {
		var out []string
		for _, sb := range l {
			out = append(out, sb.ID)
		}
		return out
	}

	removed, err := kit.Collect(context.Background(), list, roche.GCOptions{DryRun: true}, destroy)
	if err != nil || !slices.Equal(ids(removed), []string{"expired", "stopped", "stuck"}) || len(destroyed) != 0 {
		t.Fatalf("dry run: %v %v, destroyed %v", ids(removed), err, destroyed)
	}
	removed, err = kit.Collect(context.Background(), list, roche.GCOptions{}, destroy)
	if err == nil || !slices.Equal(ids(removed), []string{"expired", "stopped"}) || !slices.Equal(destroyed, []string{"expired", "stopped"}) {
		t.Fatalf("gc: %v %v, destroyed %v", ids(removed), err, destroyed)
	}
	destroyed = nil
	removed, _ = kit.Collect(context.Background(), list, roche.GCOptions{All: true}, destroy)
	if !slices.Equal(ids(removed), []string{"live", "expired", "stopped"}) {
		t.Fatalf("gc --all: %v", ids(removed))
	}
	// An owner limits it to that owner's.
	list[0].Owner, list[1].Owner = "cli:ada@host", "cli:bob@host"
	destroyed = nil
	removed, _ = kit.Collect(context.Background(), list, roche.GCOptions{All: true, Owner: "cli:ada@host"}, destroy)
	if !slices.Equal(ids(removed), []string{"live"}) || !slices.Equal(destroyed, []string{"live"}) {
		t.Fatalf("gc --all of one owner: %v, destroyed %v", ids(removed), destroyed)
	}
}

// TestMarkUnstarted: only a sandbox still created past the bound becomes exited.
func TestMarkUnstarted(t *testing.T) {
	now := time.Now()
	list := []roche.SandboxInfo{
		{ID: "old-created", State: roche.StateCreated, CreatedAt: now.Add(-time.Hour)},
		{ID: "new-created", State: roche.StateCreated, CreatedAt: now.Add(-time.Second)},
		{ID: "old-running", State: roche.StateRunning, CreatedAt: now.Add(-time.Hour)},
	}
	kit.MarkUnstarted(list, time.Minute)
	for i, want := range []roche.SandboxState{roche.StateExited, roche.StateCreated, roche.StateRunning} {
		if list[i].State != want {
			t.Errorf("%s: %s, want %s", list[i].ID, list[i].State, want)
		}
	}
}
