package guestfwd

import (
	"context"
	"errors"
	"net"
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

// TestStreamEndedByTheCallerIsNotTheSandboxGone: a download the caller stops by ending
// its context (as a copy refused over its cap does) ends with the context's error, and
// the sandbox is not asked after (Gone polls the engine for seconds, and the provider
// forgets the sandbox); a connection that fails under a live context still is.
func TestStreamEndedByTheCallerIsNotTheSandboxGone(t *testing.T) {
	// An agent that streams data frames until its connection closes.
	agent := func(ctx context.Context) (net.Conn, error) {
		client, server := net.Pipe()
		go func() {
			defer server.Close()
			if _, _, err := guest.ReadFrame(server, nil); err != nil {
				return
			}
			chunk := make([]byte, 4096)
			for guest.WriteFrame(server, guest.FrameData, chunk) == nil {
			}
		}()
		return client, nil
	}
	asked := 0
	tg := Target{ID: "docker-0123", Agent: guest.NewClientWithDialer("test", agent), Gone: func() bool { asked++; return false }}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := tg.CopyTarFrom(ctx, "/tmp/huge", writerFunc(func(p []byte) (int, error) {
		cancel() // the caller has seen enough: a header over its cap
		return len(p), nil
	}))
	if !errors.Is(err, context.Canceled) || asked != 0 {
		t.Fatalf("a copy out the caller cancelled: %v (asked Gone %d times), want context.Canceled without asking", err, asked)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	f := Forwarder{Reach: func(context.Context, string) (Target, error) { return tg, nil }}
	err = f.ReadFile(ctx, tg.ID, "/tmp/huge", writerFunc(func(p []byte) (int, error) {
		cancel()
		return len(p), nil
	}))
	if !errors.Is(err, context.Canceled) || asked != 0 {
		t.Fatalf("a read the caller cancelled: %v (asked Gone %d times), want context.Canceled without asking", err, asked)
	}

	// The agent's end closing under a live context is still a question for Gone.
	tg.Agent = guest.NewClientWithDialer("test", func(context.Context) (net.Conn, error) {
		client, server := net.Pipe()
		go func() {
			guest.ReadFrame(server, nil)
			server.Close()
		}()
		return client, nil
	})
	err = tg.CopyTarFrom(context.Background(), "/tmp/huge", writerFunc(func(p []byte) (int, error) { return len(p), nil }))
	if err == nil || asked != 1 {
		t.Fatalf("a copy out whose agent hung up: %v (asked Gone %d times), want an error after asking once", err, asked)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
