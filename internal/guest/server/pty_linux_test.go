package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// screen collects a terminal's output for tests that wait for text on it.
type screen struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	written chan struct{} // closed and replaced by each write
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written != nil {
		close(s.written)
		s.written = nil
	}
	return s.buf.Write(p)
}

// changed is closed by the next write.
func (s *screen) changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written == nil {
		s.written = make(chan struct{})
	}
	return s.written
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until the screen shows want after the first skip bytes.
func (s *screen) waitFor(t *testing.T, want string, skip int) int {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		changed := s.changed() // before looking: a write in between is not missed
		out := s.String()
		if i := strings.Index(out[min(skip, len(out)):], want); i >= 0 {
			return skip + i + len(want)
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("%q never appeared on the terminal; it shows %q", want, s.String())
		}
	}
}

// TestTerminal: the command's streams are a terminal of the size asked, it is its
// controlling terminal, and it runs as the sandbox user.
func TestTerminal(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	res, out, _ := execOut(t, guest.Request{TTY: true, Cols: 101, Rows: 33,
		Cmd: []string{"sh", "-c", "tty; stty size; id -u; test -t 2 && echo tty2; ps -o sid= -p $$; echo $$; echo $TERM; exit 4"}}, guest.ExecOptions{})
	lines := strings.Split(strings.ReplaceAll(out, "\r\n", "\n"), "\n")
	if res.ExitCode != 4 || len(lines) < 7 {
		t.Fatalf("exit %d output %q, want 4 and seven lines", res.ExitCode, out)
	}
	if !strings.HasPrefix(lines[0], "/dev/pts/") || lines[1] != "33 101" || lines[2] != fmt.Sprint(sandboxUser) || lines[3] != "tty2" {
		t.Errorf("tty, size, uid, stderr on the terminal: %q", lines[:4])
	}
	if strings.TrimSpace(lines[4]) != lines[5] {
		t.Errorf("the command does not lead its own session: sid %q pid %q", lines[4], lines[5])
	}
	if lines[6] == "" {
		t.Error("TERM is not set")
	}
}

// TestTerminalInteractive: typed input reaches the shell, a typed Ctrl-C interrupts its
// foreground job at once, a resize reaches stty, and the exit status comes back.
func TestTerminalInteractive(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	inR, inW := io.Pipe()
	defer inW.Close()
	resize := make(chan guest.Winsize, 1)
	var scr screen
	done := make(chan guest.Result, 1)
	go func() {
		res, err := client.Exec(ctxT(t, time.Minute), guest.Request{TTY: true, Cmd: []string{"sh", "-i"}},
			guest.ExecOptions{Stdin: inR, Stdout: &scr, Resize: resize})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	type_ := func(s string) {
		if _, err := inW.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	type_("echo h''i\n")
	at := scr.waitFor(t, "hi\r\n", 0)
	// The foreground job says it runs, then becomes sleep (the quotes keep the typed
	// line, which the terminal echoes, from matching).
	type_("sh -c 'echo sleep\"\"ing; exec sleep 100'\n")
	at = scr.waitFor(t, "sleeping\r\n", at)
	start := time.Now()
	type_("\x03")
	type_("echo interrupted\n")
	at = scr.waitFor(t, "interrupted\r\n", at)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Ctrl-C took %v to interrupt sleep", d)
	}
	// Nothing says when the new size is set (dash runs a WINCH trap only at its next
	// command): ask stty until it says so.
	resize <- guest.Winsize{Cols: 120, Rows: 40}
	for deadline := time.Now().Add(20 * time.Second); ; {
		type_("stty size; echo as''ked\n")
		end := scr.waitFor(t, "asked\r\n", at)
		if strings.Contains(scr.String()[at:end], "40 120\r\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal is not 40x120 20 s after the resize: %q", scr.String()[at:end])
		}
		at = end
	}
	type_("exit 3\n")
	select {
	case res := <-done:
		if res.ExitCode != 3 {
			t.Errorf("exit %d, want 3", res.ExitCode)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the shell did not exit")
	}
}

// TestTerminalSession: a background terminal is typed into and resized by pid, its
// output attached to, and killed by a signal.
func TestTerminalSession(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ctx := ctxT(t, time.Minute)
	st, err := client.Start(ctx, guest.Request{TTY: true, Cols: 90, Rows: 20, Cmd: []string{"sh", "-i"}})
	if err != nil {
		t.Fatal(err)
	}
	pid := st.PID
	var scr screen
	attached := make(chan guest.Result, 1)
	actx, detach := context.WithCancel(ctx)
	defer detach()
	go func() {
		res, _ := client.Attach(actx, pid, guest.ExecOptions{Stdout: &scr})
		attached <- res
	}()
	if err := client.Input(ctx, pid, []byte("stty size\n")); err != nil {
		t.Fatal(err)
	}
	at := scr.waitFor(t, "20 90\r\n", 0)
	if err := client.Resize(ctx, pid, guest.Winsize{Cols: 132, Rows: 50}); err != nil {
		t.Fatal(err)
	}
	if err := client.Input(ctx, pid, []byte("stty size\n")); err != nil {
		t.Fatal(err)
	}
	scr.waitFor(t, "50 132\r\n", at)
	// Leaving the attach leaves the terminal running.
	detach()
	<-attached
	if err := client.Input(ctx, pid, []byte("exit 6\n")); err != nil {
		t.Fatal(err)
	}
	res, err := client.Attach(ctx, pid, guest.ExecOptions{})
	if err != nil || res.ExitCode != 6 {
		t.Fatalf("attach after exit: %v exit %d, want 6", err, res.ExitCode)
	}
	if err := client.Input(ctx, pid, []byte("x")); codeOf(err) != guest.CodeNotFound {
		t.Errorf("input to a finished terminal: %v, want not found", err)
	}
	st, err = client.Start(ctx, guest.Request{Cmd: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	plain := st.PID
	defer client.Signal(ctx, plain, 9)
	if err := client.Resize(ctx, plain, guest.Winsize{Cols: 1, Rows: 1}); codeOf(err) != guest.CodeInvalid {
		t.Errorf("resizing a command without a terminal: %v, want invalid", err)
	}
}

// TestTerminalEndsWithItsCommand: a descendant left holding the terminal (and a write
// pending into it) does not hold up the command's result.
func TestTerminalEndsWithItsCommand(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	start := time.Now()
	res, out, _ := execOut(t, guest.Request{TTY: true, Cmd: []string{"sh", "-c", "sleep 3 & echo started; exit 2"}}, guest.ExecOptions{
		Stdin: strings.NewReader(strings.Repeat("x", 64<<10)),
	})
	if res.ExitCode != 2 || !strings.Contains(out, "started") {
		t.Fatalf("exit %d output %q, want 2 and the output", res.ExitCode, out)
	}
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Errorf("the result took %v: it waited for the descendant holding the terminal", d)
	}
}
