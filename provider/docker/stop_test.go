package docker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// TestExecWhenSandboxStops: a command running when its sandbox stops ends with an error
// that says so, not with an exit status (143 for SIGTERM, 137 for SIGKILL) that would
// look like the command's own.
func TestExecWhenSandboxStops(t *testing.T) {
	p := newProvider(t)
	dc := engineClient(t)
	for _, tc := range []struct {
		name     string
		lifetime int    // seconds; 0 for the default
		signal   string // sent to the container by the engine; "" waits for the lifetime
		want     string
	}{
		{"killed", 0, "KILL", "is gone"},
		{"stopped by its engine", 0, "TERM", "stopped while the command ran: the sandbox is stopping: its engine stopped it (roche-agent, its PID 1, got SIGTERM)"},
		{"lifetime over", 3, "", "stopped while the command ran: the sandbox is stopping: its lifetime of 3s ended"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			if tc.lifetime > 0 {
				cfg.TimeoutSecs = tc.lifetime
			}
			id := sandbox(t, p, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ready := &firstOutput{ch: make(chan struct{})}
			type outcome struct {
				res roche.ExecResult
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo ready; exec sleep 30"}, Stdout: ready, Timeout: 40 * time.Second})
				done <- outcome{res, err}
			}()
			select {
			case <-ready.ch:
			case o := <-done:
				t.Fatalf("the command ended before it was stopped: %+v %v", o.res, o.err)
			}
			if tc.signal != "" {
				if err := dc.ContainerKill(ctx, id, tc.signal); err != nil {
					t.Fatal(err)
				}
			}
			var o outcome
			select {
			case o = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the command did not end within 20 s of its sandbox stopping")
			}
			if o.err == nil {
				t.Fatalf("exec ended with %+v and no error, want one saying the sandbox stopped", o.res)
			}
			if !errors.Is(o.err, roche.ErrNotFound) || !strings.Contains(o.err.Error(), tc.want) || !strings.Contains(o.err.Error(), id) {
				t.Fatalf("exec error %q, want ErrNotFound naming sandbox %s and saying %q", o.err, id, tc.want)
			}
		})
	}
}

// firstOutput closes ch at the command's first output.
type firstOutput struct {
	once sync.Once
	ch   chan struct{}
}

func (f *firstOutput) Write(b []byte) (int, error) {
	f.once.Do(func() { close(f.ch) })
	return len(b), nil
}

// TestAttachWhenSandboxStops: a client following a background command hears that the
// sandbox stopped, its exit status unknown, not the exit status the stop gave it.
func TestAttachWhenSandboxStops(t *testing.T) {
	p := newProvider(t)
	dc := engineClient(t)
	id := sandbox(t, p, testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, err := p.StartCommand(ctx, id, roche.CommandRequest{Cmd: []string{"sh", "-c", "echo ready; exec sleep 30"}})
	if err != nil {
		t.Fatal(err)
	}
	ready := &firstOutput{ch: make(chan struct{})}
	type ended struct {
		end roche.CommandEnd
		err error
	}
	done := make(chan ended, 1)
	go func() {
		end, err := p.ConnectCommand(ctx, id, roche.CommandSelector{PID: cmd.PID}, roche.CommandOffsets{}, roche.CommandOutput{
			Data: func(_ roche.Stream, _ int64, b []byte) error { _, err := ready.Write(b); return err },
		})
		done <- ended{end, err}
	}()
	<-ready.ch
	if err := dc.ContainerKill(ctx, id, "TERM"); err != nil {
		t.Fatal(err)
	}
	var e ended
	select {
	case e = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the connection did not end within 20 s of its sandbox stopping")
	}
	if e.err != nil || e.end.ExitCode != -1 || !strings.Contains(e.end.Unknown, "the sandbox is stopping: its engine stopped it") {
		t.Fatalf("connect: %+v %v, want the exit status unknown because the sandbox is stopping", e.end, e.err)
	}
}
