package cli

import (
	"bufio"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

// TestBackgroundCommands: roche exec --background starts a command that outlives the
// roche that started it; roche commands lists it, replays its output from offsets
// (raw, or as JSON lines with each piece's offset), feeds its stdin, signals and kills
// it by pid or tag, and exits with its status; an idempotency key runs a command once.
func TestBackgroundCommands(t *testing.T) {
	r := run(t, "create", "--image", testImage())
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { run(t, "destroy", id) })

	r = run(t, "exec", "--sandbox", id, "-d", "--tag", "count", "--", "sh", "-c", "echo one; echo two >&2; echo three; exit 4")
	if r.code != 0 {
		t.Fatalf("exec -d: %+v", r)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(r.stdout))
	if err != nil || pid <= 0 {
		t.Fatalf("exec -d printed %q, want a pid", r.stdout)
	}
	if r := run(t, "commands", "connect", "--sandbox", id, "--tag", "count"); r.code != 4 || r.stdout != "one\nthree\n" || r.stderr != "two\n" {
		t.Fatalf("connect by tag: %+v, want exit 4 and the output", r)
	}
	r = run(t, "commands", "connect", "--sandbox", id, strconv.Itoa(pid), "--stdout-offset", "4", "--json")
	if r.code != 4 {
		t.Fatalf("connect --json: %+v", r)
	}
	var stdout strings.Builder
	var end *roche.CommandEnd
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for i := 0; sc.Scan(); i++ {
		var ev commandEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		switch {
		case i == 0 && (ev.Start == nil || ev.Start.PID != pid || ev.Start.StdoutOffset != 4):
			t.Fatalf("first line %q, want the start at stdout offset 4", sc.Text())
		case ev.Stream == "stdout":
			if *ev.Offset != int64(4+stdout.Len()) {
				t.Errorf("stdout piece at %d after %d bytes from 4", *ev.Offset, stdout.Len())
			}
			stdout.Write(ev.Data)
		case ev.End != nil:
			end = ev.End
		}
	}
	if stdout.String() != "three\n" || end == nil || end.ExitCode != 4 {
		t.Fatalf("connect --json from stdout offset 4: stdout %q, end %+v", stdout.String(), end)
	}

	// Stdin kept open, fed, closed; the list says so before.
	r = run(t, "exec", "--sandbox", id, "-d", "--keep-stdin", "--", "sh", "-c", "cat; echo eof")
	cat := strings.TrimSpace(r.stdout)
	r = run(t, "commands", "list", "--sandbox", id, "--json")
	var list []roche.Command
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 2 || !list[1].Stdin || list[0].Tag != "count" {
		t.Fatalf("list --json: %+v %v", list, err)
	}
	if r := rocheIn(t, "fed\n", "commands", "send-stdin", "--sandbox", id, cat); r.code != 0 {
		t.Fatalf("send-stdin: %+v", r)
	}
	if r := run(t, "commands", "send-stdin", "--sandbox", id, cat, "and more\n", "--close"); r.code != 0 {
		t.Fatalf("send-stdin DATA --close: %+v", r)
	}
	if r := run(t, "commands", "connect", "--sandbox", id, cat); r.code != 0 || r.stdout != "fed\nand more\neof\n" {
		t.Fatalf("connect to cat: %+v", r)
	}

	// Signals by name, kill by tag.
	r = run(t, "exec", "--sandbox", id, "-d", "--tag", "sleeper", "--", "sleep", "300")
	if r := run(t, "commands", "signal", "--sandbox", id, "--tag", "sleeper", "TERM"); r.code != 0 {
		t.Fatalf("signal TERM: %+v", r)
	}
	if r := run(t, "commands", "connect", "--sandbox", id, "--tag", "sleeper"); r.code != 128+15 {
		t.Fatalf("after TERM: %+v, want exit 143", r)
	}
	if r := run(t, "commands", "list", "--sandbox", id); !strings.Contains(r.stdout, "killed by TERM") {
		t.Errorf("list: %q, want the sleeper killed by TERM", r.stdout)
	}

	// One key, one run.
	for range 2 {
		r := run(t, "exec", "--sandbox", id, "--idempotency-key", "once", "--", "sh", "-c", "echo x >> /tmp/runs; wc -l < /tmp/runs")
		if r.code != 0 || strings.TrimSpace(r.stdout) != "1" {
			t.Fatalf("keyed exec: %+v, want it to have run once", r)
		}
	}

	for _, bad := range []struct {
		args []string
		says string
	}{
		{[]string{"commands", "connect", "--sandbox", id}, "name the command"},
		{[]string{"commands", "connect", "--sandbox", id, "x1"}, `"x1" is not a pid`},
		{[]string{"commands", "signal", "--sandbox", id, strconv.Itoa(pid), "BOGUS"}, `"BOGUS" is not a signal`},
		{[]string{"exec", "--sandbox", id, "--tag", "x", "--", "true"}, "are for a command started with --background"},
		{[]string{"exec", "--sandbox", id, "-d", "--window", "1g", "--", "true"}, "window"},
		{[]string{"commands", "connect", "--sandbox", id, "99999"}, "no process 99999"},
	} {
		r := run(t, bad.args...)
		if r.code == 0 || !strings.Contains(r.stderr, bad.says) || strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
			t.Errorf("%v: %+v, want one line saying %q", bad.args, r, bad.says)
		}
	}
}
