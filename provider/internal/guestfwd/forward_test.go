package guestfwd

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
)

// TestFailSaysWhetherTheSandboxIsGone: an error the agent reported keeps its meaning; a
// connection that failed is ErrNotFound, "gone", only when the provider says the sandbox
// no longer exists, and otherwise stays the connection's error, naming the sandbox.
func TestFailSaysWhetherTheSandboxIsGone(t *testing.T) {
	refused := errors.New("dial unix /run/roche/x/agent.sock: connect: connection refused")
	gone, asked := false, 0
	tg := Target{ID: "docker-0123", Gone: func() bool { asked++; return gone }}

	if err := tg.fail(&guest.Error{Code: guest.CodeNotFound, Message: "no such file"}); !errors.Is(err, roche.ErrNotFound) || asked != 0 {
		t.Fatalf("an agent's not-found: %v (asked Gone %d times)", err, asked)
	}
	err := tg.fail(refused)
	if errors.Is(err, roche.ErrNotFound) || !errors.Is(err, refused) || !strings.Contains(err.Error(), "docker-0123") {
		t.Fatalf("a refused connection to a sandbox that exists: %v", err)
	}
	gone = true
	err = tg.fail(refused)
	if !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "sandbox docker-0123 is gone") {
		t.Fatalf("a refused connection to a sandbox that is gone: %v", err)
	}
	// Where the provider can tell why it ended, the error says so.
	end := roche.EndReason{Kind: roche.EndOOM, Detail: "killed for exceeding its memory limit", Evidence: "OOMKilled, exit 137"}
	tg.Ended = func() *roche.EndReason { return &end }
	err = tg.fail(refused)
	var ended *roche.EndedError
	if !errors.Is(err, roche.ErrNotFound) || !errors.As(err, &ended) || ended.End.Kind != roche.EndOOM || !strings.Contains(err.Error(), "exit 137") {
		t.Fatalf("a refused connection to a sandbox that ended of OOM: %v, want an EndedError (oom) wrapping ErrNotFound", err)
	}
	tg.Ended = func() *roche.EndReason { return nil }
	if err = tg.fail(refused); !errors.Is(err, roche.ErrNotFound) || errors.As(err, &ended) {
		t.Fatalf("a refused connection to a sandbox that ended for a reason unknown: %v", err)
	}
}

// TestForwarderRefusesBeforeReaching: a request the core refuses, or a path that is not
// absolute, is refused without reaching for the sandbox.
func TestForwarderRefusesBeforeReaching(t *testing.T) {
	reached := 0
	f := Forwarder{Reach: func(context.Context, string) (Target, error) {
		reached++
		return Target{ID: "x"}, nil
	}}
	ctx := context.Background()
	if _, err := f.Exec(ctx, "x", roche.ExecRequest{}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("an exec without a command: %v", err)
	}
	if _, err := f.StartCommand(ctx, "x", roche.CommandRequest{}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("a start without a command: %v", err)
	}
	if _, err := f.StartCommand(ctx, "x", roche.CommandRequest{Cmd: []string{"true"}, Window: roche.MaxCommandWindow + 1}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("a start with a window over the maximum: %v", err)
	}
	if _, err := f.ConnectCommand(ctx, "x", roche.CommandSelector{}, roche.CommandOffsets{}, roche.CommandOutput{}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("a connect naming no command: %v", err)
	}
	if err := f.SignalCommand(ctx, "x", roche.CommandSelector{PID: 1}, 0); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("signal 0: %v", err)
	}
	if reached != 0 {
		t.Fatalf("reached for the sandbox %d times", reached)
	}
	for _, p := range []string{"relative", "/", "/.."} {
		if err := f.CopyTarTo(ctx, "x", p, strings.NewReader("")); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("CopyTarTo %q: %v", p, err)
		}
		if err := f.CopyTarFrom(ctx, "x", p, nil); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("CopyTarFrom %q: %v", p, err)
		}
	}
}
