package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/server"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// oneConnAgent starts an agent serving one connection (Config.ConnFD, a one-shot
// sandbox's) beside the tests' shared one, and returns the host's end, after the
// agent's ready frame, and the agent's end of Run.
func oneConnAgent(t *testing.T) (net.Conn, <-chan error) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostFile := os.NewFile(uintptr(fds[0]), "host")
	host, err := net.FileConn(hostFile)
	hostFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	srv, err := server.New(server.Config{ConnFD: fds[1], User: fmt.Sprintf("%d:%d", sandboxUser, sandboxUser), NoFile: -1})
	if err != nil {
		syscall.Close(fds[1])
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(context.Background()) }()
	_ = host.SetReadDeadline(time.Now().Add(10 * time.Second))
	kind, payload, err := guest.ReadFrame(host, nil)
	_ = host.SetReadDeadline(time.Time{})
	if err != nil {
		t.Fatalf("no ready frame from the agent: %v", err)
	}
	var h guest.Health
	if kind != guest.FrameReply || json.Unmarshal(payload, &h) != nil || h.PID != os.Getpid() {
		t.Fatalf("the agent's first frame is %q %q, want its health as a reply", kind, payload)
	}
	return host, done
}

// once is a client whose one dial is conn.
func once(conn net.Conn) *guest.Client {
	used := false
	return guest.NewClientWithDialer("one-shot", func(context.Context) (net.Conn, error) {
		if used {
			return nil, fmt.Errorf("dialed twice")
		}
		used = true
		return conn, nil
	})
}

func awaitRun(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the agent's Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the agent still serves 10 s after %s", why)
	}
}

// TestOneConnection: an agent given one connection says it is ready on it, runs the
// command asked for there as any other (output, stdin, exit status, as the sandbox
// user), and stops once it has answered.
func TestOneConnection(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	host, done := oneConnAgent(t)
	var out, errOut bytes.Buffer
	res, err := once(host).Exec(context.Background(),
		guest.Request{Cmd: []string{"sh", "-c", "id -u; cat; echo err >&2; exit 3"}, TimeoutMS: 10_000},
		guest.ExecOptions{Stdin: strings.NewReader("typed\n"), Stdout: &out, Stderr: &errOut})
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d\ntyped\n", sandboxUser); res.ExitCode != 3 || out.String() != want || errOut.String() != "err\n" {
		t.Errorf("exit %d stdout %q stderr %q, want 3 %q %q", res.ExitCode, out.String(), errOut.String(), want, "err\n")
	}
	awaitRun(t, done, "its one command ended")
}

// TestOneConnectionLost: the host's end closing (its process killed) kills the command
// and everything it started, and stops the agent, as a lost lease does.
func TestOneConnectionLost(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	host, done := oneConnAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan string, 1)
	out := &lineWriter{ch: started}
	go func() {
		_, _ = once(host).Exec(ctx, guest.Request{Cmd: []string{"sh", "-c", "sleep 600 & echo $$ $!; wait"}, TimeoutMS: 600_000},
			guest.ExecOptions{Stdout: out})
	}()
	var pids []int
	select {
	case line := <-started:
		pids = pidsFrom(t, line)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("the command did not start")
	}
	cancel() // closes the host's end
	awaitRun(t, done, "its connection closed")
	waitGone(t, pids)
}
