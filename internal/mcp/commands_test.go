package mcp_test

import (
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/mcp"
)

// TestBackgroundCommands: a model starts a command, reads its output over several calls
// from the offsets each returned (every byte once), sees it end with its exit code,
// lists and kills commands; output fallen out of the window is refused naming the first
// offset kept; another session cannot reach the sandbox's commands.
func TestBackgroundCommands(t *testing.T) {
	s, _ := newServer(t, mcp.Config{})
	cs := connect(t, s)
	var sb struct {
		ID string `json:"id"`
	}
	call(t, cs, "create_sandbox", map[string]any{}, &sb)

	var started mcp.StartCommandOutput
	call(t, cs, "start_command", map[string]any{"sandbox_id": sb.ID, "tag": "counter",
		"command": []string{"sh", "-c", "for i in 1 2 3 4 5; do echo line$i; sleep 0.2; done; echo done >&2; exit 2"}}, &started)
	if started.PID <= 0 {
		t.Fatalf("start_command returned %+v", started)
	}
	var stdout, stderr strings.Builder
	var next mcp.ReadCommandOutput
	reads := 0
	for next.ExitCode == nil {
		if reads++; reads > 100 {
			t.Fatalf("the command never ended: %+v", next)
		}
		var got mcp.ReadCommandOutput
		text, isErr := call(t, cs, "read_command_output", map[string]any{"sandbox_id": sb.ID, "pid": started.PID,
			"stdout_offset": next.NextStdoutOffset, "stderr_offset": next.NextStderrOffset, "wait_secs": 5}, &got)
		if isErr {
			t.Fatalf("read_command_output: %s", text)
		}
		if got.NextStdoutOffset != next.NextStdoutOffset+int64(len(got.Stdout)) {
			t.Fatalf("a read from %d returned %d bytes and next offset %d", next.NextStdoutOffset, len(got.Stdout), got.NextStdoutOffset)
		}
		stdout.WriteString(got.Stdout)
		stderr.WriteString(got.Stderr)
		if got.Running == (got.ExitCode != nil) {
			t.Fatalf("a read says running %v and exit code %v", got.Running, got.ExitCode)
		}
		next = got
	}
	if stdout.String() != "line1\nline2\nline3\nline4\nline5\n" || stderr.String() != "done\n" || *next.ExitCode != 2 {
		t.Fatalf("over %d reads: stdout %q stderr %q exit %d", reads, stdout.String(), stderr.String(), *next.ExitCode)
	}
	if reads < 2 {
		t.Errorf("one read returned it all: the reads did not follow the command as it went")
	}

	var sleeper mcp.StartCommandOutput
	call(t, cs, "start_command", map[string]any{"sandbox_id": sb.ID, "command": []string{"sleep", "300"}}, &sleeper)
	var list mcp.ListCommandsOutput
	call(t, cs, "list_commands", map[string]any{"sandbox_id": sb.ID}, &list)
	if len(list.Commands) != 2 || list.Commands[0].Tag != "counter" || *list.Commands[0].ExitCode != 2 || !list.Commands[1].Running {
		t.Fatalf("list_commands: %+v", list)
	}
	var killed mcp.KillCommandOutput
	call(t, cs, "kill_command", map[string]any{"sandbox_id": sb.ID, "pid": sleeper.PID, "signal": "TERM"}, &killed)
	if !killed.Signalled {
		t.Fatal("kill_command did not signal the running command")
	}
	var after mcp.ReadCommandOutput
	call(t, cs, "read_command_output", map[string]any{"sandbox_id": sb.ID, "pid": sleeper.PID, "wait_secs": 10}, &after)
	if after.ExitCode == nil || *after.ExitCode != 143 || after.Signal != 15 {
		t.Fatalf("after TERM: %+v", after)
	}
	call(t, cs, "kill_command", map[string]any{"sandbox_id": sb.ID, "pid": sleeper.PID}, &killed)
	if killed.Signalled {
		t.Error("kill_command of an ended command says it signalled it")
	}

	// Past the window (16 MiB): refused, naming the first offset kept.
	var big mcp.StartCommandOutput
	call(t, cs, "start_command", map[string]any{"sandbox_id": sb.ID, "command": []string{"head", "-c", "17000000", "/dev/zero"}}, &big)
	var end mcp.ReadCommandOutput
	for end.ExitCode == nil {
		call(t, cs, "read_command_output", map[string]any{"sandbox_id": sb.ID, "pid": big.PID, "stdout_offset": 16900000, "wait_secs": 5}, &end)
	}
	text, isErr := call(t, cs, "read_command_output", map[string]any{"sandbox_id": sb.ID, "pid": big.PID}, nil)
	if !isErr || !strings.Contains(text, "first stdout byte still kept is at offset 222784") || !strings.Contains(text, "change the arguments") {
		t.Fatalf("a read from offset 0 past the window: %q", text)
	}
	var capped mcp.ReadCommandOutput
	call(t, cs, "read_command_output", map[string]any{"sandbox_id": sb.ID, "pid": big.PID, "stdout_offset": 222784, "max_output_bytes": 1000}, &capped)
	if !capped.More || len(capped.Stdout) != 1000 || capped.NextStdoutOffset != 223784 {
		t.Fatalf("a capped read: more %v, %d bytes, next %d", capped.More, len(capped.Stdout), capped.NextStdoutOffset)
	}

	other := connect(t, s)
	if text, isErr := call(t, other, "read_command_output", map[string]any{"sandbox_id": sb.ID, "pid": started.PID}, nil); !isErr || !strings.Contains(text, "no sandbox") {
		t.Errorf("another session read the command: %q", text)
	}
	if text, isErr := call(t, cs, "read_command_output", map[string]any{"sandbox_id": sb.ID, "pid": 0}, nil); !isErr || !strings.Contains(text, "pid 0") {
		t.Errorf("pid 0: %q", text)
	}
}
