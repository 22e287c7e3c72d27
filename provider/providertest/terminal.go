package providertest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// screen is a terminal's output as a test reads it.
type screen struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until the screen shows want after the first skip bytes; it returns the
// offset past it. A microVM under emulation is slow: the margin is wide.
func (s *screen) waitFor(t *testing.T, want string, skip int) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out := s.String()
		if i := strings.Index(out[min(skip, len(out)):], want); i >= 0 {
			return skip + i + len(want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never appeared on the terminal; it shows %q", want, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testTerminal: a shell on a terminal of the size asked, as the sandbox user, that
// follows a resize, whose foreground job a typed Ctrl-C interrupts, and whose exit status
// comes back; and a background session typed into, resized and killed by pid. A
// provider (or a sandbox's transport) without terminals refuses with ErrUnsupported.
func (s *suite) testTerminal(t *testing.T, id string) {
	term := s.p.(roche.Terminal)
	ctx := ctxFor(t, 3*time.Minute)
	uid := s.pyOK(t, id, "import os; print(os.getuid())")

	in, typing := io.Pipe()
	defer typing.Close()
	resize := make(chan roche.TerminalSize, 1)
	var scr screen
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, err := term.Shell(ctx, id, roche.TerminalRequest{Size: roche.TerminalSize{Cols: 100, Rows: 30}},
			roche.TerminalIO{Stdin: in, Output: &scr, Resize: resize})
		done <- result{code, err}
	}()
	typed := make(chan error, 1)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		// Typed once the shell has shown its prompt: a shell sets its terminal up as it
		// starts, and one set up with TCSAFLUSH drops what was typed before.
		for deadline := time.Now().Add(time.Minute); scr.String() == "" && time.Now().Before(deadline); {
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		_, err := typing.Write([]byte("stty size; id -u\n"))
		typed <- err
	}()
	select {
	case r := <-done:
		if errors.Is(r.err, roche.ErrUnsupported) {
			t.Logf("refused, as it should be where there are no terminals: %v", r.err)
			return
		}
		t.Fatalf("the shell ended at once: exit %d, %v; screen %q", r.code, r.err, scr.String())
	case <-typed:
	}
	typeIn := func(s string) {
		t.Helper()
		if _, err := typing.Write([]byte(s)); err != nil {
			t.Fatalf("typing %q: %v", s, err)
		}
	}
	at := scr.waitFor(t, "30 100\r\n", 0)
	at = scr.waitFor(t, uid+"\r\n", at)
	resize <- roche.TerminalSize{Cols: 120, Rows: 40}
	time.Sleep(300 * time.Millisecond)
	typeIn("stty size\n")
	at = scr.waitFor(t, "40 120\r\n", at)
	typeIn("sleep 100\n")
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	typeIn("\x03")
	typeIn("echo after-int''errupt\n")
	scr.waitFor(t, "after-interrupt\r\n", at)
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Ctrl-C took %v to interrupt sleep 100", d)
	}
	typeIn("exit 3\n")
	select {
	case r := <-done:
		if r.err != nil || r.code != 3 {
			t.Fatalf("the shell's end: exit %d, %v; want exit 3", r.code, r.err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the shell did not exit; screen %q", scr.String())
	}

	pid, err := term.StartTerminal(ctx, id, roche.TerminalRequest{Cmd: []string{"sh", "-c", "stty size; exec cat"}, Size: roche.TerminalSize{Cols: 50, Rows: 10}})
	if err != nil {
		t.Fatal(err)
	}
	var sess screen
	actx, detach := context.WithCancel(ctx)
	attached := make(chan error, 1)
	go func() { _, err := term.AttachTerminal(actx, id, pid, &sess); attached <- err }()
	at = sess.waitFor(t, "10 50\r\n", 0)
	if err := term.TerminalInput(ctx, id, pid, []byte("typed\n")); err != nil {
		t.Fatal(err)
	}
	sess.waitFor(t, "typed\r\n", at)
	if err := term.ResizeTerminal(ctx, id, pid, roche.TerminalSize{Cols: 60, Rows: 20}); err != nil {
		t.Fatal(err)
	}
	detach()
	<-attached
	if err := term.KillTerminal(ctx, id, pid); err != nil {
		t.Fatal(err)
	}
	if res, err := term.AttachTerminal(ctx, id, pid, io.Discard); err != nil || res.ExitCode != 137 {
		t.Fatalf("the killed session's result: %+v %v, want exit 137", res, err)
	}
	if err := term.TerminalInput(ctx, id, pid, []byte("x")); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("input to an ended session: %v, want ErrNotFound", err)
	}

	// Input typed at once into the image's shell and then ended, before the shell has
	// set its terminal up, as roche shell types piped input: the shell runs it and exits
	// at the end of the input (a Ctrl-D typed only once then would be lost to bash's line
	// editor, which takes over the terminal after it was typed).
	pid, err = term.StartTerminal(ctx, id, roche.TerminalRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := term.TerminalInput(ctx, id, pid, []byte("echo $((6*7))-ended\n")); err != nil {
		t.Fatal(err)
	}
	if err := term.EndTerminalInput(ctx, id, pid); err != nil {
		t.Fatal(err)
	}
	var ended screen
	ectx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := term.AttachTerminal(ectx, id, pid, &ended)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("a shell whose input ended: %+v %v, want it to exit 0 by itself; screen %q", res, err, ended.String())
	}
	ended.waitFor(t, "42-ended\r\n", 0)
}
