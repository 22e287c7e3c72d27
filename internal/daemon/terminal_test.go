package daemon

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// lockedBuffer is a screen written by the output stream and read by the test.
type lockedBuffer = testenv.SyncBuffer

// waitScreen waits for want on the screen, woken by each write to it.
func waitScreen(t *testing.T, scr *lockedBuffer, want string) {
	t.Helper()
	scr.Await(t, want, nil, 30*time.Second)
}

// countSleepers counts the processes in the sandbox running sleep 4242.
func countSleepers(ctx context.Context, t *testing.T, p roche.Provider, id string) string {
	t.Helper()
	res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"sh", "-c",
		`for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^[s]leep 4242' || true`}})
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(res.Stdout)
}

// TestPtySessions: PTY sessions through the API, as a tenant: a session outlives the
// output stream it was read on, a Shell (kill_on_close) does not, and another tenant
// cannot reach either.
func TestPtySessions(t *testing.T) {
	td := startTenantDaemon(t, Config{}, []string{"acme", "bolt"}, nil)
	ctx := ctxFor(t, 3*time.Minute)
	acme, bolt := td.client(t, "acme"), td.client(t, "bolt")
	sb, err := acme.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer acme.Destroy(context.Background(), sb.ID)

	pid, err := acme.StartTerminal(ctx, sb.ID, roche.TerminalRequest{Cmd: []string{"sh", "-c", "stty size; exec sleep 4242"}, Size: roche.TerminalSize{Cols: 77, Rows: 11}})
	if err != nil {
		t.Fatal(err)
	}
	var scr lockedBuffer
	actx, detach := context.WithCancel(ctx)
	attached := make(chan error, 1)
	go func() { _, err := acme.AttachTerminal(actx, sb.ID, pid, &scr); attached <- err }()
	waitScreen(t, &scr, "11 77")
	detach()
	<-attached
	if n := countSleepers(ctx, t, acme, sb.ID); n != "1" {
		t.Fatalf("%s sessions running after the output stream ended, want 1 (a session outlives its reader)", n)
	}
	for name, call := range map[string]func() error{
		"CreatePty": func() error { _, err := bolt.StartTerminal(ctx, sb.ID, roche.TerminalRequest{}); return err },
		"ConnectPty": func() error {
			_, err := bolt.AttachTerminal(ctx, sb.ID, pid, io.Discard)
			return err
		},
		"SendPtyInput":              func() error { return bolt.TerminalInput(ctx, sb.ID, pid, []byte("x")) },
		"SendPtyInput end_of_input": func() error { return bolt.EndTerminalInput(ctx, sb.ID, pid) },
		"ResizePty":                 func() error { return bolt.ResizeTerminal(ctx, sb.ID, pid, roche.TerminalSize{Cols: 1, Rows: 1}) },
		"KillPty":                   func() error { return bolt.KillTerminal(ctx, sb.ID, pid) },
	} {
		if err := call(); !errors.Is(err, roche.ErrNotFound) {
			t.Errorf("%s on another tenant's sandbox: %v, want not found", name, err)
		}
	}
	if err := acme.KillTerminal(ctx, sb.ID, pid); err != nil {
		t.Fatal(err)
	}
	if res, err := acme.AttachTerminal(ctx, sb.ID, pid, io.Discard); err != nil || res.ExitCode != 137 {
		t.Fatalf("a killed session's result: %+v %v, want exit 137", res, err)
	}

	// A Shell ends with its call: cancelling it kills what it runs.
	var shellScr lockedBuffer
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := acme.Shell(sctx, sb.ID, roche.TerminalRequest{Cmd: []string{"sh", "-c", "echo ready; exec sleep 4242"}},
			roche.TerminalIO{Output: &shellScr})
		done <- err
	}()
	waitScreen(t, &shellScr, "ready")
	cancel()
	<-done
	deadline := time.Now().Add(30 * time.Second)
	for countSleepers(ctx, t, acme, sb.ID) != "0" {
		if time.Now().After(deadline) {
			t.Fatal("the shell outlived the call that ran it")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Logged once the kill has returned, which may be just after the shell is seen gone.
	killed := map[string]any{"op": "kill_pty", "tenant": "acme", "why": "its kill_on_close stream ended", "ok": true}
	for deadline := time.Now().Add(10 * time.Second); !hasAudit(td.auditLines(t), killed); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no audit line for the kill of the shell whose stream ended")
		}
	}
	if !hasAudit(td.auditLines(t), map[string]any{"op": "create_pty", "tenant": "acme", "id": sb.ID}) {
		t.Error("no audit line for create_pty")
	}
}
