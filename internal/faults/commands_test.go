package faults

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestDurableCommandThroughRochedKill9: a background command prints a numbered line
// every 100 ms. Its client reads some of it and disconnects; roched is killed with
// SIGKILL and started again on the same state; a new client connects from the offsets
// the first one saved. Every line arrives exactly once, in order, and the command's
// real exit code comes back: the command belonged to the sandbox, not to the client or
// to roched, and the new roched reached it through the agent.
func TestDurableCommandThroughRochedKill9(t *testing.T) {
	dir := shortDir(t)
	first := startRochedIn(t, dir)
	ctx := context.Background()
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	sb, _, err := first.c.Create(ctx, "docker", cfg)
	if err != nil {
		t.Fatal(err)
	}
	const lines = 50
	script := fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "line $i"; i=$((i+1)); sleep 0.1; done; echo done >&2; exit 3`, lines)
	p := first.c.Provider("docker")
	cmd, err := p.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"sh", "-c", script}, Tag: "counter"})
	if err != nil {
		t.Fatal(err)
	}

	// The first client reads ten lines, saves its offsets, and goes away.
	var mu sync.Mutex
	var got bytes.Buffer
	var saved roche.CommandOffsets
	tenth := make(chan struct{})
	var once sync.Once
	cctx, disconnect := context.WithCancel(ctx)
	connected := make(chan error, 1)
	go func() {
		_, err := p.ConnectCommand(cctx, sb.ID, roche.CommandSelector{PID: cmd.PID}, roche.CommandOffsets{}, roche.CommandOutput{
			Data: func(s roche.Stream, off int64, data []byte) error {
				mu.Lock()
				defer mu.Unlock()
				if s == roche.StreamStdout {
					if off != saved.Stdout {
						t.Errorf("first client: stdout piece at %d, expected %d", off, saved.Stdout)
					}
					got.Write(data)
					saved.Stdout = off + int64(len(data))
					if strings.Count(got.String(), "\n") >= 10 {
						once.Do(func() { close(tenth) })
					}
				} else {
					saved.Stderr = off + int64(len(data))
				}
				return nil
			},
		})
		connected <- err
	}()
	select {
	case <-tenth:
	case <-time.After(time.Minute):
		t.Fatal("the first ten lines never came")
	}
	disconnect()
	<-connected
	mu.Lock()
	from := saved
	mu.Unlock()

	first.kill(t)
	time.Sleep(time.Second) // the command goes on meanwhile: ten lines more, unread
	second := startRochedIn(t, dir)
	defer func() {
		if err := second.c.Provider("docker").Destroy(context.Background(), sb.ID); err != nil {
			t.Errorf("destroying the sandbox: %v", err)
		}
	}()

	var rest bytes.Buffer
	var stderr bytes.Buffer
	next := from
	end, err := second.c.Provider("docker").ConnectCommand(ctx, sb.ID, roche.CommandSelector{Tag: "counter"}, from, roche.CommandOutput{
		Started: func(st roche.CommandStart) {
			if st.PID != cmd.PID || st.From != from {
				t.Errorf("the second client started at %+v, want pid %d from %+v", st, cmd.PID, from)
			}
		},
		Data: func(s roche.Stream, off int64, data []byte) error {
			if s == roche.StreamStdout {
				if off != next.Stdout {
					t.Errorf("second client: stdout piece at %d, expected %d", off, next.Stdout)
				}
				rest.Write(data)
				next.Stdout = off + int64(len(data))
			} else {
				stderr.Write(data)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatalf("connecting through the restarted roched: %v", err)
	}
	if end.Unknown != "" || end.ExitCode != 3 {
		t.Errorf("the command ended %+v, want its real exit code, 3", end)
	}
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if all := got.String() + rest.String(); all != want.String() {
		t.Errorf("the lines across both clients are not 1 to %d exactly once in order:\nfirst client %q\nsecond client %q", lines, got.String(), rest.String())
	}
	if stderr.String() != "done\n" {
		t.Errorf("stderr from offset %d: %q, want the rest of it", from.Stderr, stderr.String())
	}
	t.Logf("first client read %d bytes; roched killed and restarted; the second read %d more from offset %d", got.Len(), rest.Len(), from.Stdout)
}
