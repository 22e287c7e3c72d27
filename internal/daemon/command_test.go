package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

// TestCommandsAsTenants: durable commands through the API, as tenants. A tenant reaches
// only its own sandboxes' commands (another's are not found, whatever the call); the
// daemon's bound on commands running at once in one sandbox holds, and a keyed retry
// at the bound still gets its command; output that fell out of a command's window is
// OUT_OF_RANGE with the reason OUTPUT_GONE on the wire; starts and signals are audited.
func TestCommandsAsTenants(t *testing.T) {
	td := startTenantDaemon(t, Config{MaxCommands: 2}, []string{"acme", "bolt"}, nil)
	ctx := ctxFor(t, 3*time.Minute)
	acme, bolt := td.client(t, "acme"), td.client(t, "bolt")
	sb, err := acme.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer acme.Destroy(context.Background(), sb.ID)

	first, err := acme.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"sleep", "300"}, Tag: "one", IdempotencyKey: "k-one", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	sel := roche.CommandSelector{PID: first.PID}
	for name, call := range map[string]func() error{
		"StartCommand": func() error {
			_, err := bolt.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"true"}})
			return err
		},
		"ListCommands": func() error { _, err := bolt.Commands(ctx, sb.ID); return err },
		"ConnectCommand": func() error {
			_, err := bolt.ConnectCommand(ctx, sb.ID, sel, roche.CommandOffsets{}, roche.CommandOutput{})
			return err
		},
		"SendCommandInput":  func() error { return bolt.SendCommandInput(ctx, sb.ID, sel, []byte("x")) },
		"CloseCommandInput": func() error { return bolt.CloseCommandInput(ctx, sb.ID, sel) },
		"SignalCommand":     func() error { return bolt.SignalCommand(ctx, sb.ID, sel, 9) },
		"Exec with a key": func() error {
			_, err := bolt.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}, IdempotencyKey: "k-one"})
			return err
		},
	} {
		if err := call(); !errors.Is(err, roche.ErrNotFound) {
			t.Errorf("%s on another tenant's sandbox: %v, want not found", name, err)
		}
	}
	list, err := acme.Commands(ctx, sb.ID)
	if err != nil || len(list) != 1 || list[0].PID != first.PID || list[0].Tag != "one" || !list[0].Stdin {
		t.Fatalf("the owner's list: %+v %v", list, err)
	}

	// The bound: two running, a third refused; the first's keyed retry still answers.
	second, err := acme.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acme.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"sleep", "300"}}); !errors.Is(err, roche.ErrExhausted) {
		t.Errorf("a third command with --max-commands 2: %v, want exhausted", err)
	}
	again, err := acme.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"sleep", "300"}, IdempotencyKey: "k-one"})
	if err != nil || again.PID != first.PID || !again.Existing {
		t.Errorf("a keyed retry at the bound: %+v %v, want pid %d, existing", again, err, first.PID)
	}
	for _, c := range []roche.Command{first, second} {
		if err := acme.SignalCommand(ctx, sb.ID, roche.CommandSelector{PID: c.PID}, 9); err != nil {
			t.Fatal(err)
		}
		end, err := acme.ConnectCommand(ctx, sb.ID, roche.CommandSelector{PID: c.PID}, roche.CommandOffsets{Stdout: -1, Stderr: -1}, roche.CommandOutput{})
		if err != nil || end.Signal != 9 {
			t.Fatalf("killed command %d: %+v %v", c.PID, end, err)
		}
	}

	// Fallen out of the window: OUT_OF_RANGE, reason OUTPUT_GONE, the first offset kept named.
	big, err := acme.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"head", "-c", "3000", "/dev/zero"}, Window: 1000})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the windowed command to end", func() bool {
		list, err := acme.Commands(ctx, sb.ID)
		for _, c := range list {
			if c.PID == big.PID {
				return err == nil && !c.Running
			}
		}
		return false
	})
	stream, err := td.rpc("acme").ConnectCommand(ctx, connect.NewRequest(&rochev1.ConnectCommandRequest{
		SandboxId: sb.ID, Command: wire.SelectorToProto(roche.CommandSelector{PID: big.PID}),
	}))
	if err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		t.Errorf("a connect from a gone offset sent %v", stream.Msg())
	}
	var ce *connect.Error
	if !errors.As(stream.Err(), &ce) || ce.Code() != connect.CodeOutOfRange || !strings.Contains(ce.Message(), "2000") {
		t.Fatalf("connect from offset 0 of a 1000-byte window over 3000 bytes: %v, want OUT_OF_RANGE naming 2000", stream.Err())
	}
	if s, _ := wire.FromStatus(ce); s != roche.ErrOutputGone {
		t.Errorf("the error's detail reads as %v, want ErrOutputGone", s)
	}
	stream.Close()

	if !hasAudit(td.auditLines(t), map[string]any{"op": "start_command", "tenant": "acme", "id": sb.ID, "pid": first.PID}) {
		t.Error("no audit line for start_command")
	}
	if !hasAudit(td.auditLines(t), map[string]any{"op": "signal_command", "tenant": "acme", "id": sb.ID, "signal": 9, "ok": true}) {
		t.Error("no audit line for signal_command")
	}
	if !hasAudit(td.auditLines(t), map[string]any{"op": "signal_command", "tenant": "bolt", "ok": false}) {
		t.Error("no audit line for another tenant's refused signal_command")
	}
}
