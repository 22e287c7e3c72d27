package providertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// Followed is what one ConnectCommand delivered.
type Followed struct {
	mu     sync.Mutex
	Start  roche.CommandStart
	Stdout bytes.Buffer
	Stderr bytes.Buffer
	// gaps names any piece whose offset did not follow the one before in its stream.
	gaps []string
}

func (f *Followed) output() roche.CommandOutput {
	next := map[roche.Stream]int64{}
	return roche.CommandOutput{
		Started: func(st roche.CommandStart) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.Start = st
			next[roche.StreamStdout], next[roche.StreamStderr] = st.From.Stdout, st.From.Stderr
		},
		Data: func(stream roche.Stream, off int64, data []byte) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			if off != next[stream] {
				f.gaps = append(f.gaps, fmt.Sprintf("%s piece at %d, expected %d", stream, off, next[stream]))
			}
			next[stream] = off + int64(len(data))
			if stream == roche.StreamStderr {
				f.Stderr.Write(data)
			} else {
				f.Stdout.Write(data)
			}
			return nil
		},
	}
}

// String is what both streams delivered, for messages.
func (f *Followed) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("stdout %q stderr %q", f.Stdout.String(), f.Stderr.String())
}

// FollowCommand connects to a durable command from from and returns what it delivered
// and how the command ended; the offsets of the pieces must follow each other.
func FollowCommand(ctx context.Context, t *testing.T, r roche.BackgroundRunner, id string, sel roche.CommandSelector, from roche.CommandOffsets) (*Followed, roche.CommandEnd, error) {
	t.Helper()
	f := &Followed{}
	end, err := r.ConnectCommand(ctx, id, sel, from, f.output())
	if len(f.gaps) > 0 {
		t.Errorf("connect %s from %+v: the offsets skipped: %v", sel, from, f.gaps)
	}
	return f, end, err
}

// waitCommandEnded waits until the command pid is listed as ended, and returns it.
func waitCommandEnded(ctx context.Context, t *testing.T, r roche.BackgroundRunner, id string, pid int) roche.Command {
	t.Helper()
	for {
		list, err := r.Commands(ctx, id)
		if err != nil {
			t.Fatalf("Commands: %v", err)
		}
		for _, c := range list {
			if c.PID == pid && !c.Running && c.End != nil {
				return c
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("command %d did not end: %+v", pid, list)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// testDurableCommands: a command started in the background with stdin, a tag, env and
// a working directory is listed as such, reads what is sent until its input is closed,
// replays its output from any offsets still kept and refuses those no longer kept
// (naming the first kept), ends by a signal sent by tag, and starts once per
// idempotency key; a command its sandbox's destroy ends reports no exit status.
func (s *suite) testDurableCommands(t *testing.T, id string) {
	r := s.p.(roche.BackgroundRunner)
	ctx := ctxFor(t, 4*time.Minute)
	py := func(code string) []string { return append(append([]string{}, s.opts.Python...), "-c", code) }

	echo, err := r.StartCommand(ctx, id, roche.CommandRequest{
		Cmd: py("import os, sys\nfor line in sys.stdin:\n    print('got:' + line.strip() + ':' + os.environ['WHO'] + ':' + os.getcwd(), flush=True)\n" +
			"print('bye', file=sys.stderr)\nsys.exit(7)"),
		Tag: "echo", Stdin: true, Env: map[string]string{"WHO": "me"}, Workdir: "/tmp",
	})
	if errors.Is(err, roche.ErrUnsupported) {
		// A transport without roche-agent (docker's exec API) has no durable commands,
		// and says so in one line; a keyed exec, which would be one, is refused too.
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("the refusal is not one line: %q", err)
		}
		_, kerr := s.p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"true"}, IdempotencyKey: "k"})
		if !errors.Is(kerr, roche.ErrUnsupported) {
			t.Errorf("a keyed exec where there are no durable commands: %v, want ErrUnsupported", kerr)
		}
		t.Logf("refused, as it should be where there are no durable commands: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("StartCommand: %v", err)
	}
	if echo.PID <= 0 || echo.Tag != "echo" || !echo.Running {
		t.Fatalf("started %+v", echo)
	}
	list, err := r.Commands(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, c := range list {
		if c.PID == echo.PID {
			listed = true
			if c.Tag != "echo" || !c.Stdin || c.Env["WHO"] != "me" || c.Workdir != "/tmp" || c.Window != roche.DefaultCommandWindow || c.StartedAt.IsZero() {
				t.Errorf("listed %+v", c)
			}
		}
	}
	if !listed {
		t.Fatalf("pid %d not listed: %+v", echo.PID, list)
	}
	for _, line := range []string{"a\n", "b\n"} {
		if err := r.SendCommandInput(ctx, id, roche.CommandSelector{PID: echo.PID}, []byte(line)); err != nil {
			t.Fatalf("SendCommandInput: %v", err)
		}
	}
	if err := r.CloseCommandInput(ctx, id, roche.CommandSelector{Tag: "echo"}); err != nil {
		t.Fatalf("CloseCommandInput: %v", err)
	}
	f, end, err := FollowCommand(ctx, t, r, id, roche.CommandSelector{PID: echo.PID}, roche.CommandOffsets{})
	want := "got:a:me:/tmp\ngot:b:me:/tmp\n"
	if err != nil || end.ExitCode != 7 || end.Unknown != "" || f.Stdout.String() != want || f.Stderr.String() != "bye\n" {
		t.Fatalf("connect from 0: %v %+v %s", err, end, f)
	}
	if f.Start.PID != echo.PID || f.Start.From != (roche.CommandOffsets{}) {
		t.Errorf("connect from 0 started %+v", f.Start)
	}
	from := roche.CommandOffsets{Stdout: int64(len("got:a:me:/tmp\n")), Stderr: 3}
	f, end, err = FollowCommand(ctx, t, r, id, roche.CommandSelector{Tag: "echo"}, from)
	if err != nil || end.ExitCode != 7 || f.Stdout.String() != "got:b:me:/tmp\n" || f.Stderr.String() != "\n" {
		t.Errorf("connect from %+v: %v %+v %s", from, err, end, f)
	}
	if err := r.SendCommandInput(ctx, id, roche.CommandSelector{PID: echo.PID}, []byte("late\n")); err == nil {
		t.Error("input to an ended command was accepted")
	}

	// Past its window, the oldest output is gone: asking for it names the first kept.
	const window, total = 1024, 4000
	big, err := r.StartCommand(ctx, id, roche.CommandRequest{Cmd: py(fmt.Sprintf("print('x' * %d)", total-1)), Window: window})
	if err != nil {
		t.Fatal(err)
	}
	if c := waitCommandEnded(ctx, t, r, id, big.PID); c.End.ExitCode != 0 || c.First.Stdout != total-window || c.Written.Stdout != total {
		t.Fatalf("the windowed command ended as %+v, want exit 0 with stdout kept from %d to %d", c, total-window, total)
	}
	_, _, err = FollowCommand(ctx, t, r, id, roche.CommandSelector{PID: big.PID}, roche.CommandOffsets{})
	if !errors.Is(err, roche.ErrOutputGone) || !strings.Contains(err.Error(), fmt.Sprint(total-window)) {
		t.Fatalf("connect from 0 past the window: %v, want ErrOutputGone naming offset %d", err, total-window)
	}
	f, _, err = FollowCommand(ctx, t, r, id, roche.CommandSelector{PID: big.PID}, roche.CommandOffsets{Stdout: total - window})
	if err != nil || f.Stdout.String() != strings.Repeat("x", window-1)+"\n" {
		t.Fatalf("connect from the first kept: %v, %d bytes", err, f.Stdout.Len())
	}

	// A signal by tag reaches the command's process group; its end says which.
	loop, err := r.StartCommand(ctx, id, roche.CommandRequest{Cmd: []string{"sh", "-c", "sleep 300 & wait"}, Tag: "loop"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SignalCommand(ctx, id, roche.CommandSelector{Tag: "loop"}, 9); err != nil {
		t.Fatal(err)
	}
	if _, end, err := FollowCommand(ctx, t, r, id, roche.CommandSelector{PID: loop.PID}, roche.CommandOffsets{}); err != nil || end.Signal != 9 || end.ExitCode != 137 {
		t.Errorf("killed: %v %+v, want signal 9, exit 137", err, end)
	}
	if _, _, err := FollowCommand(ctx, t, r, id, roche.CommandSelector{PID: 999999}, roche.CommandOffsets{}); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("connect to no such command: %v, want ErrNotFound", err)
	}

	// One idempotency key, one run: a retried exec joins the first run's command.
	count := fmt.Sprintf("/tmp/runs-%d", time.Now().UnixNano())
	run := roche.ExecRequest{Cmd: []string{"sh", "-c", "echo x >> " + count + "; echo ran"}, IdempotencyKey: "once-" + count}
	for i := range 2 {
		res, err := s.p.Exec(ctx, id, run)
		if err != nil || res.ExitCode != 0 || res.Stdout != "ran\n" {
			t.Fatalf("keyed exec %d: %v %+v", i, err, res)
		}
	}
	if out := s.pyOK(t, id, "print(open('"+count+"').read().count('x'))"); out != "1" {
		t.Errorf("a retried keyed exec ran %s times, want 1", out)
	}
	key := roche.CommandRequest{Cmd: []string{"sleep", "300"}, IdempotencyKey: "bg-" + count}
	first, err := r.StartCommand(ctx, id, key)
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.StartCommand(ctx, id, key)
	if err != nil || again.PID != first.PID || !again.Existing {
		t.Errorf("a second start with one key: %v %+v, want pid %d, existing", err, again, first.PID)
	}
	_ = r.SignalCommand(ctx, id, roche.CommandSelector{PID: first.PID}, 9)

	// A command its sandbox's destroy ends: no exit status is made up.
	own := s.create(t, s.opts.Config)
	sleeper, err := r.StartCommand(ctx, own, roche.CommandRequest{Cmd: []string{"sh", "-c", "echo up; sleep 300"}})
	if err != nil {
		t.Fatal(err)
	}
	type ended struct {
		end roche.CommandEnd
		err error
		f   *Followed
	}
	done := make(chan ended, 1)
	up := make(chan struct{})
	var once sync.Once
	go func() {
		f := &Followed{}
		out := f.output()
		data := out.Data
		out.Data = func(st roche.Stream, off int64, p []byte) error {
			once.Do(func() { close(up) })
			return data(st, off, p)
		}
		end, err := r.ConnectCommand(ctx, own, roche.CommandSelector{PID: sleeper.PID}, roche.CommandOffsets{}, out)
		done <- ended{end, err, f}
	}()
	select {
	case <-up:
	case <-ctx.Done():
		t.Fatal("the command's output never came")
	}
	if err := s.p.Destroy(ctx, own); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-done:
		if e.err != nil || e.end.Unknown == "" || e.end.ExitCode != -1 {
			t.Errorf("following a command whose sandbox was destroyed: %v %+v, want the exit status unknown, saying why", e.err, e.end)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the connection did not end within 2 minutes of its sandbox's destroy")
	}
}

// testNoDurableCommands: a provider without processes (wasm) refuses durable
// commands, and keyed execs, with ErrUnsupported in one line, whether or not it
// implements the calls (roched's client does for every provider).
func (s *suite) testNoDurableCommands(t *testing.T, id string) {
	ctx := ctxFor(t, time.Minute)
	if r, ok := s.p.(roche.BackgroundRunner); ok {
		_, err := r.StartCommand(ctx, id, roche.CommandRequest{Cmd: []string{"true"}})
		if !errors.Is(err, roche.ErrUnsupported) || strings.Contains(err.Error(), "\n") {
			t.Errorf("StartCommand on a provider without processes: %v, want ErrUnsupported in one line", err)
		}
	}
	_, err := s.p.Exec(ctx, id, roche.ExecRequest{Cmd: append(append([]string{}, s.opts.Python...), "-c", "pass"), IdempotencyKey: "k"})
	if !errors.Is(err, roche.ErrUnsupported) || strings.Contains(err.Error(), "\n") {
		t.Errorf("a keyed exec on a provider without processes: %v, want ErrUnsupported in one line", err)
	}
}
