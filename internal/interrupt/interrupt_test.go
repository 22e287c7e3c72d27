package interrupt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary, run again with ROCHE_INTERRUPT_CHILD set, is a command using Context:
// it reports its context's end, then hangs in its cleanup, so that only a second signal
// ends it.
func TestMain(m *testing.M) {
	if os.Getenv("ROCHE_INTERRUPT_CHILD") != "" {
		ctx, stop := Context(os.Stderr, "child", syscall.SIGPIPE)
		defer stop()
		fmt.Println("ready")
		<-ctx.Done()
		var sig Signal
		fmt.Printf("cancelled %v %v %v\n", errors.As(context.Cause(ctx), &sig), errors.Is(context.Cause(ctx), context.Canceled), sig.ExitCode())
		select {} // a cleanup that never ends: only a second signal ends the command
	}
	os.Exit(m.Run())
}

type child struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr strings.Builder
	exited chan struct{} // closed when the child has exited and been waited for
}

func start(t *testing.T) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], "-test.run=^$"), lines: make(chan string, 4), exited: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), "ROCHE_INTERRUPT_CHILD=1")
	c.cmd.Stderr = &c.stderr
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.Stdout = w
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		defer r.Close()
		lines := bufio.NewScanner(r)
		for lines.Scan() {
			c.lines <- lines.Text()
		}
	}()
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
	})
	if got := c.line(t); got != "ready" {
		t.Fatalf("child printed %q, want ready", got)
	}
	return c
}

func (c *child) line(t *testing.T) string {
	t.Helper()
	select {
	case l := <-c.lines:
		return l
	case <-time.After(30 * time.Second):
		t.Fatal("the child printed nothing in 30 s")
		return ""
	}
}

func (c *child) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// exit waits for the child to exit and returns its status.
func (c *child) exit(t *testing.T) int {
	t.Helper()
	select {
	case <-c.exited:
		return c.cmd.ProcessState.ExitCode()
	case <-time.After(5 * time.Second):
		t.Fatal("the child did not exit within 5 s of the second signal")
		return 0
	}
}

func TestSecondSignalExits(t *testing.T) {
	for _, tc := range []struct {
		first, second syscall.Signal
		code          int
	}{
		{syscall.SIGINT, syscall.SIGINT, 130},
		{syscall.SIGTERM, syscall.SIGTERM, 143},
		{syscall.SIGINT, syscall.SIGTERM, 143},
	} {
		t.Run(fmt.Sprintf("%v then %v", tc.first, tc.second), func(t *testing.T) {
			c := start(t)
			c.signal(t, tc.first)
			want := fmt.Sprintf("cancelled true true %d", Signal{tc.first}.ExitCode())
			if got := c.line(t); got != want {
				t.Fatalf("after %v the child printed %q, want %q", tc.first, got, want)
			}
			c.signal(t, tc.second)
			if code := c.exit(t); code != tc.code {
				t.Fatalf("exit status %d after a second signal, want %d", code, tc.code)
			}
			if want := fmt.Sprintf("child: %v again: exiting without finishing cleanup", tc.second); !strings.Contains(c.stderr.String(), want) {
				t.Fatalf("stderr %q, want %q", c.stderr.String(), want)
			}
		})
	}
}

// An extra signal cancels like the others; more of it do not make the command exit
// before its cleanup, a Ctrl-C still does.
func TestExtraSignalCancelsOnly(t *testing.T) {
	c := start(t)
	c.signal(t, syscall.SIGPIPE)
	if got, want := c.line(t), fmt.Sprintf("cancelled true true %d", 128+int(syscall.SIGPIPE)); got != want {
		t.Fatalf("after SIGPIPE the child printed %q, want %q", got, want)
	}
	c.signal(t, syscall.SIGPIPE)
	select {
	case <-c.exited:
		t.Fatalf("a second SIGPIPE ended the child before its cleanup (status %d)", c.cmd.ProcessState.ExitCode())
	case <-time.After(300 * time.Millisecond):
	}
	c.signal(t, syscall.SIGINT)
	if code := c.exit(t); code != 130 {
		t.Fatalf("exit status %d after Ctrl-C, want 130", code)
	}
}
