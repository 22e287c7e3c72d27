package oci_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

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
