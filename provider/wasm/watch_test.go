package wasm

import (
	"fmt"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// TestPollDiff: what a wasm watch reports between two looks at a tree.
func TestPollDiff(t *testing.T) {
	t0 := time.Unix(1000, 0)
	before := map[string]polled{
		"kept":    {size: 1, modTime: t0, mode: 0o644},
		"grown":   {size: 1, modTime: t0, mode: 0o644},
		"touched": {size: 1, modTime: t0, mode: 0o644},
		"chmod":   {size: 1, modTime: t0, mode: 0o644},
		"gone":    {size: 1, modTime: t0, mode: 0o644},
		"dir":     {modTime: t0, mode: 0o755, dir: true},
	}
	now := map[string]polled{
		"kept":    {size: 1, modTime: t0, mode: 0o644},
		"grown":   {size: 2, modTime: t0, mode: 0o644},
		"touched": {size: 1, modTime: t0.Add(time.Second), mode: 0o644},
		"chmod":   {size: 1, modTime: t0, mode: 0o600},
		"new":     {size: 0, modTime: t0, mode: 0o644},
		"dir":     {modTime: t0.Add(time.Second), mode: 0o755, dir: true}, // an entry in it changed, reported there
	}
	got := fmt.Sprint(diff(before, now))
	want := fmt.Sprint([]roche.FileEvent{
		{Name: "gone", Op: roche.FileRemove},
		{Name: "new", Op: roche.FileCreate},
		{Name: "chmod", Op: roche.FileChmod},
		{Name: "grown", Op: roche.FileWrite},
		{Name: "touched", Op: roche.FileWrite},
	})
	if got != want {
		t.Errorf("diff: %s, want %s", got, want)
	}
	if d := diff(now, now); len(d) != 0 {
		t.Errorf("no change reported %v", d)
	}
}
