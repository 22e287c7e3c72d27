package oci_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/provider/oci"
)

// msgLog keeps the messages logged.
type msgLog struct {
	mu   sync.Mutex
	msgs []string
}

func (*msgLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *msgLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *msgLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *msgLog) WithGroup(string) slog.Handler      { return l }

// TestDestroyTearsDownOnce: a destroy kills the sandbox's PID 1, which the provider
// watches to tear down a sandbox whose agent ended by itself; the destroy's own exit is
// not taken for one, so that no second teardown (another run of the runtime to ask the
// container's state, another delete) runs after it, which Close, and so a one-shot roche
// run, would wait for.
func TestDestroyTearsDownOnce(t *testing.T) {
	var logs msgLog
	p, _ := newProvider(t, oci.WithLogger(slog.New(&logs)))
	ctx := context.Background()
	for range 3 {
		info, err := p.Create(ctx, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Destroy(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	}
	p.Close() // waits for the watches' teardowns
	logs.mu.Lock()
	defer logs.mu.Unlock()
	for _, m := range logs.msgs {
		if m == "sandbox ended (its roche-agent exited): tearing it down" {
			t.Errorf("a destroyed sandbox was torn down again by the watch of its PID 1: %q", m)
		}
	}
}

// TestSweepOncePerStateDir: a create sweeps the state directory for ended sandboxes in
// the background at most once a minute, counted across processes (a stamp in the
// directory), not per process: a one-shot roche run does not list the runtime's
// containers every time. Once the minute has passed, the next create does sweep.
func TestSweepOncePerStateDir(t *testing.T) {
	first, state := newProvider(t)
	ctx := context.Background()
	cycle := func(p *oci.Provider) {
		t.Helper()
		info, err := p.Create(ctx, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Destroy(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	}
	cycle(first) // sweeps: the first in the directory
	first.Close()

	// A create that died after writing its record, long ago: a sweep clears it.
	dead := filepath.Join(state, "oci-00000000deadbeef")
	if err := os.Mkdir(dead, 0o700); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dead)
	rec := `{"id":"oci-00000000deadbeef","runtime":"runc","created":"2020-01-01T00:00:00Z","expires":"2020-01-01T00:01:00Z","start_by":"2020-01-01T00:00:30Z","uid":-1}`
	if err := os.WriteFile(filepath.Join(dead, "record.json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	again := func() {
		t.Helper()
		p, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
		if err != nil {
			t.Fatal(err)
		}
		cycle(p)
		p.Close() // waits for its sweep, if it started one
	}
	again()
	if _, err := os.Stat(dead); err != nil {
		t.Fatalf("a second process swept within sweepShared of the first: %v", err)
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(filepath.Join(state, "last-sweep"), old, old); err != nil {
		t.Fatal(err)
	}
	again()
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the create after sweepShared did not sweep: %v", err)
	}
}
