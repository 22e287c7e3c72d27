package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/server"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// The agent runs in this test process, as it runs as PID 1 in a sandbox: commands are
// forked from here as the sandbox user. One server serves every test, because its
// reaper waits for any child of the process; the tests start no children of their own.

var (
	// sandboxUser is a uid no one else on the host uses, so that the processes it leaves
	// (or must not leave) are the tests' own.
	sandboxUser = 1_500_000_000 + mathrand.IntN(100_000_000)

	client *guest.Client
	// dir is a scratch tree for the file tests, owned by the sandbox user.
	dir string
	// egressTarget is where the agent relays its egress port (a listener of the test).
	egressTarget   string
	egressListen   string
	egressTargetMu sync.Mutex
)

func TestMain(m *testing.M) {
	if testenv.Fast() {
		// No shared agent: it runs commands as another user, which needs root. The tests
		// of it skip, saying so (testenv.Needs); the others run, with cgo or without.
		os.Exit(m.Run())
	}
	if os.Geteuid() != 0 {
		fmt.Println("internal/guest/server tests need root: the agent runs commands as another user (make test runs as root)")
		os.Exit(1)
	}
	if cgoEnabled {
		fmt.Println("internal/guest/server tests need CGO_ENABLED=0, as the agent is built (make test sets it)")
		os.Exit(1)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	// The sandbox user must be able to reach its scratch tree.
	if err := os.Chmod(tmp, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir = filepath.Join(tmp, "files")
	err = os.Mkdir(dir, 0o755)
	if err == nil {
		err = os.Chown(dir, sandboxUser, sandboxUser)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Commands inherit the agent's environment, as they inherit the image's in a sandbox;
	// the test runner's PATH may lead through directories the sandbox user cannot read.
	os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	egressListen = freeLoopbackAddr()
	srv, err := server.New(server.Config{
		Socket:       filepath.Join(tmp, "agent.sock"),
		User:         fmt.Sprintf("%d:%d", sandboxUser, sandboxUser),
		EgressListen: egressListen,
		EgressDial: func() (net.Conn, error) {
			egressTargetMu.Lock()
			target := egressTarget
			egressTargetMu.Unlock()
			return net.Dial("tcp", target)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	client = guest.NewClient(filepath.Join(tmp, "agent.sock"))
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	err = client.WaitReady(wctx)
	wcancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent did not come up:", err)
		cancel()
		return 1
	}
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		return 1
	}
	return code
}

func freeLoopbackAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// execOut runs cmd and returns its result, stdout and stderr.
func execOut(t *testing.T, req guest.Request, opts guest.ExecOptions) (guest.Result, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	opts.Stdout, opts.Stderr = &stdout, &stderr
	res, err := client.Exec(ctxT(t, 30*time.Second), req, opts)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Cmd, err)
	}
	return res, stdout.String(), stderr.String()
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie waiting for its parent counts as gone.
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

func waitGone(t *testing.T, pids []int) {
	t.Helper()
	if left := testenv.AwaitExit(t, pids, 5*time.Second); len(left) > 0 {
		t.Fatalf("processes %v are still alive", left)
	}
}

func pidsFrom(t *testing.T, s string) []int {
	t.Helper()
	var pids []int
	for _, f := range strings.Fields(s) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("not a pid: %q in %q", f, s)
		}
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		t.Fatalf("no pids in %q", s)
	}
	return pids
}

func TestExecResult(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	res, out, errOut := execOut(t, guest.Request{Cmd: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, guest.ExecOptions{})
	if res.ExitCode != 3 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("exit %d stdout %q stderr %q, want 3 %q %q", res.ExitCode, out, errOut, "out\n", "err\n")
	}
	res, _, errOut = execOut(t, guest.Request{Cmd: []string{"no-such-program-here"}}, guest.ExecOptions{})
	if res.ExitCode != 127 || !strings.Contains(errOut, "command not found") {
		t.Errorf("missing program: exit %d stderr %q, want 127 and command not found", res.ExitCode, errOut)
	}
	res, _, _ = execOut(t, guest.Request{Cmd: []string{"sh", "-c", "kill -9 $$"}}, guest.ExecOptions{})
	if res.ExitCode != 128+9 || res.OOMKilled {
		t.Errorf("killed by SIGKILL: exit %d oom %v, want 137 and not OOM", res.ExitCode, res.OOMKilled)
	}
}

func TestExecRefusals(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	_, err := client.Exec(ctxT(t, 10*time.Second), guest.Request{}, guest.ExecOptions{})
	var ae *guest.Error
	if !errors.As(err, &ae) || ae.Code != guest.CodeInvalid {
		t.Fatalf("empty command: %v, want an invalid-request error", err)
	}
}

// TestSandboxUser: commands run as the configured user, with no capability at all and
// none to gain.
func TestSandboxUser(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	_, out, _ := execOut(t, guest.Request{Cmd: []string{"cat", "/proc/self/status"}}, guest.ExecOptions{})
	fields := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	want := fmt.Sprintf("%d\t%d\t%d\t%d", sandboxUser, sandboxUser, sandboxUser, sandboxUser)
	if fields["Uid"] != want || fields["Gid"] != want {
		t.Errorf("Uid %q Gid %q, want %q", fields["Uid"], fields["Gid"], want)
	}
	for _, c := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if fields[c] != "0000000000000000" {
			t.Errorf("%s = %q, want none", c, fields[c])
		}
	}
	if fields["Groups"] != "" {
		t.Errorf("supplementary groups %q, want none", fields["Groups"])
	}
}

// TestNoCommandHasABoundingSet: the agent keeps the capabilities it needs, and only the
// thread that forks commands has an empty bounding set (see reaper.forkThread); commands
// started at once, from requests served on many of the agent's threads, each start with
// none, as do those of a terminal and of run_code's interpreter.
func TestNoCommandHasABoundingSet(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	const probe = `grep -E '^CapBnd' /proc/self/status`
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := guest.Request{Cmd: []string{"sh", "-c", probe}}
			if i%4 == 0 {
				req.TTY = true
			}
			var stdout bytes.Buffer
			_, err := client.Exec(ctxT(t, 30*time.Second), req, guest.ExecOptions{Stdout: &stdout, Stderr: &stdout})
			if err != nil {
				t.Error(err)
				return
			}
			if got := strings.Join(strings.Fields(stdout.String()), " "); got != "CapBnd: 0000000000000000" {
				t.Errorf("command %d (tty %v): %q, want an empty bounding set", i, req.TTY, got)
			}
		}()
	}
	wg.Wait()
	// The agent itself (this test process) keeps its own on every other thread.
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) < 2 {
		t.Fatalf("threads of the agent: %v (%v)", tasks, err)
	}
	empty := 0
	for _, task := range tasks {
		if b, err := os.ReadFile(task); err == nil && strings.Contains(string(b), "CapBnd:\t0000000000000000") {
			empty++
		}
	}
	if empty != 1 {
		t.Errorf("%d of the agent's %d threads have an empty bounding set, want 1 (the one that forks)", empty, len(tasks))
	}
}

func TestExecEnvAndWorkdir(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	_, out, _ := execOut(t, guest.Request{
		Cmd: []string{"sh", "-c", `printf '%s %s' "$GREETING" "$(pwd)"`},
		Env: map[string]string{"GREETING": "hi there"}, Cwd: dir,
	}, guest.ExecOptions{})
	if want := "hi there " + dir; out != want {
		t.Errorf("got %q, want %q", out, want)
	}
}

// TestWorkdirThroughProc: CVE-2024-21626's workdir. A command changes directory after
// the fork, while it still holds the agent's descriptors, so /proc/self/fd/N (or a link
// to it) would start it in a directory the agent holds open: refused, as is any
// directory in /proc.
func TestWorkdirThroughProc(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	held, err := os.Open(dir) // the agent's side: a directory it holds open
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	fdDir := fmt.Sprintf("/proc/self/fd/%d", held.Fd())
	link := filepath.Join(t.TempDir(), "to-fd")
	if err := os.Symlink(fdDir, link); err != nil {
		t.Fatal(err)
	}
	for _, cwd := range []string{fdDir, "/proc/thread-self/fd/" + strconv.Itoa(int(held.Fd())), "/dev/fd/" + strconv.Itoa(int(held.Fd())), link, "/proc", "/proc/1/cwd"} {
		var stdout bytes.Buffer
		_, err := client.Exec(ctxT(t, 10*time.Second), guest.Request{Cmd: []string{"pwd"}, Cwd: cwd}, guest.ExecOptions{Stdout: &stdout})
		if codeOf(err) != guest.CodeInvalid || !strings.Contains(err.Error(), "/proc") {
			t.Errorf("a command with workdir %s: %v (stdout %q), want refused as in /proc", cwd, err, stdout.String())
		}
	}
	// A directory of the sandbox's own still works, also through a link.
	plain := filepath.Join(dir, "to-dir")
	if err := os.Symlink(dir, plain); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(plain)
	if _, out, _ := execOut(t, guest.Request{Cmd: []string{"pwd", "-P"}, Cwd: plain}, guest.ExecOptions{}); strings.TrimSpace(out) != dir {
		t.Errorf("pwd in %s: %q", plain, out)
	}
}

func TestStdin(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	in := strings.Repeat("line of input\n", 10000) // several frames
	_, out, _ := execOut(t, guest.Request{Cmd: []string{"cat"}}, guest.ExecOptions{Stdin: strings.NewReader(in)})
	if out != in {
		t.Errorf("cat gave back %d bytes, want the %d sent", len(out), len(in))
	}
	// Without stdin a command reads EOF at once rather than hanging.
	res, out, _ := execOut(t, guest.Request{Cmd: []string{"sh", "-c", "cat; echo done"}}, guest.ExecOptions{})
	if res.ExitCode != 0 || out != "done\n" {
		t.Errorf("no stdin: exit %d out %q", res.ExitCode, out)
	}
}

// firstWrite records when output first arrives.
type firstWrite struct {
	once sync.Once
	ch   chan struct{}
	buf  bytes.Buffer
	mu   sync.Mutex
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	w.once.Do(func() { close(w.ch) })
	return len(p), nil
}

func TestStreaming(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	w := &firstWrite{ch: make(chan struct{})}
	done := make(chan guest.Result, 1)
	go func() {
		res, err := client.Exec(ctxT(t, 30*time.Second), guest.Request{Cmd: []string{"sh", "-c", "echo first; sleep 2; echo second"}},
			guest.ExecOptions{Stdout: w})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case <-w.ch:
	case <-done:
		t.Fatal("the command ended before its first line reached the client: output is not streamed")
	case <-time.After(10 * time.Second):
		t.Fatal("no output within 10 s")
	}
	select {
	case <-done:
		t.Fatal("the result came together with the first line; the command should still be sleeping")
	default:
	}
	<-done
	if got := w.buf.String(); got != "first\nsecond\n" {
		t.Errorf("output %q", got)
	}
}

func TestOutputLimit(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	res, out, errOut := execOut(t, guest.Request{
		Cmd:         []string{"sh", "-c", "head -c 300000 /dev/zero; head -c 10 /dev/zero >&2"},
		OutputLimit: 1000,
	}, guest.ExecOptions{})
	if !res.Truncated || len(out) != 1000 || len(errOut) != 10 {
		t.Errorf("truncated %v, stdout %d bytes, stderr %d; want true, 1000, 10", res.Truncated, len(out), len(errOut))
	}
}

// TestTimeoutKillsTree: a command past its timeout is killed with everything it
// started, including a child that left the process group and one that daemonised.
func TestTimeoutKillsTree(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	start := time.Now()
	res, out, _ := execOut(t, guest.Request{
		Cmd:       []string{"sh", "-c", "sleep 300 & echo $!; setsid sleep 300 & echo $!; (sleep 300 &) ; sleep 300"},
		TimeoutMS: 500,
	}, guest.ExecOptions{})
	if !res.TimedOut {
		t.Fatalf("timed out %v, exit %d", res.TimedOut, res.ExitCode)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a 0.5 s timeout took %v to end the command", d)
	}
	waitGone(t, pidsFrom(t, out))
	assertNoSleepers(t)
}

// assertNoSleepers: no process of the sandbox user is left (every test's commands end).
func assertNoSleepers(t *testing.T) {
	t.Helper()
	// What is left may be on its way out: wait for it to end, then look again.
	var pids []int
	for _, p := range userProcesses() {
		pid, _ := strconv.Atoi(strings.Fields(p)[0])
		pids = append(pids, pid)
	}
	testenv.AwaitExit(t, pids, 5*time.Second)
	if left := userProcesses(); len(left) > 0 {
		t.Fatalf("processes of the sandbox user survived: %v", left)
	}
}

func userProcesses() []string {
	ents, _ := os.ReadDir("/proc")
	var left []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name(), &st) != nil || st.Uid != uint32(sandboxUser) {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		left = append(left, fmt.Sprintf("%d %q", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	return left
}

// TestDisconnectKills: a foreground command belongs to its connection; when the client
// goes away, it and what it started are killed.
func TestDisconnectKills(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &firstWrite{ch: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		_, err := client.Exec(ctx, guest.Request{Cmd: []string{"sh", "-c", "sleep 300 & echo $!; sleep 300"}}, guest.ExecOptions{Stdout: w})
		errc <- err
	}()
	select {
	case <-w.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the command printed nothing")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled exec returned %v", err)
	}
	w.mu.Lock()
	out := w.buf.String()
	w.mu.Unlock()
	waitGone(t, pidsFrom(t, out))
	assertNoSleepers(t)
}

func TestSignalForwarded(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	sigs := make(chan int, 1)
	w := &firstWrite{ch: make(chan struct{})}
	done := make(chan guest.Result, 1)
	go func() {
		res, err := client.Exec(ctxT(t, 30*time.Second), guest.Request{
			Cmd: []string{"sh", "-c", `trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.1; done`},
		}, guest.ExecOptions{Stdout: w, Signals: sigs})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	<-w.ch
	sigs <- int(syscall.SIGTERM)
	select {
	case res := <-done:
		w.mu.Lock()
		out := w.buf.String()
		w.mu.Unlock()
		if res.ExitCode != 42 || !strings.Contains(out, "got TERM") {
			t.Errorf("exit %d output %q, want the trap to run and exit 42", res.ExitCode, out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not reach the command")
	}
	assertNoSleepers(t)
}

func TestBackground(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ctx := ctxT(t, 30*time.Second)
	st, err := client.Start(ctx, guest.Request{Cmd: []string{"sh", "-c", "echo hi; sleep 1; echo bye; exit 5"}})
	if err != nil {
		t.Fatal(err)
	}
	pid := st.PID
	procs, err := client.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs {
		if p.PID == pid {
			found = true
			if !p.Running {
				t.Errorf("background process %d listed as not running at once", pid)
			}
		}
	}
	if !found {
		t.Fatalf("background process %d not listed: %+v", pid, procs)
	}
	var out bytes.Buffer
	res, err := client.Attach(ctx, pid, guest.ExecOptions{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 5 || out.String() != "hi\nbye\n" {
		t.Errorf("attach: exit %d output %q, want 5 and the whole output replayed", res.ExitCode, out.String())
	}
	// Attaching after it ended replays the kept output and the result again.
	out.Reset()
	if res, err = client.Attach(ctx, pid, guest.ExecOptions{Stdout: &out}); err != nil || res.ExitCode != 5 || out.String() != "hi\nbye\n" {
		t.Errorf("second attach: %v exit %d output %q", err, res.ExitCode, out.String())
	}

	// A background command outlives its connection and is stopped by Signal.
	st, err = client.Start(ctx, guest.Request{Cmd: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	pid = st.PID
	time.Sleep(100 * time.Millisecond)
	if !alive(pid) {
		t.Fatal("the background command did not outlive the connection that started it")
	}
	if err := client.Signal(ctx, pid, int(syscall.SIGTERM)); err != nil {
		t.Fatal(err)
	}
	waitGone(t, []int{pid})
	if err := client.Signal(ctx, 999999, int(syscall.SIGTERM)); err == nil {
		t.Error("signalling a pid the agent did not start succeeded")
	}
}

func TestHealth(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	h, err := client.Health(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if h.PID != os.Getpid() || h.Version != server.Version || h.RSSBytes <= 0 {
		t.Errorf("health %+v", h)
	}
}

func TestFiles(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ctx := ctxT(t, 30*time.Second)
	base := filepath.Join(dir, "files-"+t.Name())
	file := filepath.Join(base, "a", "b", "data.bin")
	content := bytes.Repeat([]byte{0, 1, 2, 255, '\n'}, 300000) // binary, several frames
	if err := client.WriteFile(ctx, file, bytes.NewReader(content), 0o640, true); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != uint32(sandboxUser) || st.Mode&0o777 != 0o640 {
		t.Errorf("written file uid %d mode %o, want the sandbox user's, 640", st.Uid, st.Mode&0o777)
	}
	var got bytes.Buffer
	if err := client.ReadFile(ctx, file, &got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), content) {
		t.Errorf("read back %d bytes, want %d identical", got.Len(), len(content))
	}
	fi, err := client.Stat(ctx, file)
	if err != nil || fi.Size != int64(len(content)) || fi.IsDir {
		t.Errorf("stat %+v %v", fi, err)
	}
	if err := client.Mkdir(ctx, filepath.Join(base, "x", "y"), true); err != nil {
		t.Fatal(err)
	}
	list, err := client.List(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, e := range list {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "a,x" {
		t.Errorf("list %v, want a,x", names)
	}
	moved := filepath.Join(base, "x", "moved.bin")
	if err := client.Rename(ctx, file, moved); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("rename left the old name: %v", err)
	}
	if err := client.Remove(ctx, base, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(base); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("recursive remove left %s: %v", base, err)
	}
	if _, err := client.Stat(ctx, base); codeOf(err) != guest.CodeNotFound {
		t.Errorf("stat of a removed path: %v, want not found", err)
	}
}

func codeOf(err error) string {
	var ae *guest.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

// TestFileRefusals: the files API does only what the sandbox user could, and never
// follows a symlink or climbs out with "..".
func TestFileRefusals(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ctx := ctxT(t, 30*time.Second)
	base := filepath.Join(dir, "refusals")
	if err := client.Mkdir(ctx, base, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	// A victim only root may read or write, and a root-owned directory.
	victimDir := t.TempDir()
	victim := filepath.Join(victimDir, "secret")
	if err := os.WriteFile(victim, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(victimDir, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	dirLink := filepath.Join(base, "dirlink")
	if err := os.Symlink(victimDir, dirLink); err != nil {
		t.Fatal(err)
	}

	var sink bytes.Buffer
	cases := []struct {
		name string
		do   func() error
		want string
	}{
		{"read a root-only file", func() error { return client.ReadFile(ctx, victim, &sink) }, guest.CodePermission},
		{"write into a root-owned directory", func() error {
			return client.WriteFile(ctx, filepath.Join(victimDir, "dropped"), strings.NewReader("x"), 0o644, false)
		}, guest.CodePermission},
		{"read through a symlink", func() error { return client.ReadFile(ctx, link, &sink) }, guest.CodePermission},
		{"write through a symlink", func() error {
			return client.WriteFile(ctx, link, strings.NewReader("overwritten"), 0o644, false)
		}, guest.CodePermission},
		{"write below a symlinked directory", func() error {
			return client.WriteFile(ctx, filepath.Join(dirLink, "dropped"), strings.NewReader("x"), 0o644, false)
		}, guest.CodePermission},
		{"list through a symlinked directory", func() error { _, err := client.List(ctx, dirLink); return err }, guest.CodePermission},
		{"a relative path", func() error { return client.ReadFile(ctx, "tmp/x", &sink) }, guest.CodeInvalid},
		{"a path with ..", func() error { return client.ReadFile(ctx, base+"/../refusals/link", &sink) }, guest.CodeInvalid},
		{"a missing file", func() error { return client.ReadFile(ctx, filepath.Join(base, "missing"), &sink) }, guest.CodeNotFound},
	}
	for _, c := range cases {
		err := c.do()
		if err == nil {
			t.Errorf("%s: succeeded", c.name)
			continue
		}
		if c.want != "" && codeOf(err) != c.want {
			t.Errorf("%s: %v (code %q), want code %q", c.name, err, codeOf(err), c.want)
		}
	}
	if sink.Len() != 0 {
		t.Errorf("a refused read sent data: %q", sink.String())
	}
	if b, _ := os.ReadFile(victim); string(b) != "root only" {
		t.Errorf("the victim file changed: %q", b)
	}
	if ents, _ := os.ReadDir(victimDir); len(ents) != 1 {
		t.Errorf("something was written into the victim directory: %v", ents)
	}
	// Stat describes a symlink without following it.
	fi, err := client.Stat(ctx, link)
	if err != nil || fi.Symlink != victim {
		t.Errorf("stat of a symlink: %+v %v, want it described as a link to %s", fi, err, victim)
	}
}

func TestTarRoundTrip(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ctx := ctxT(t, 30*time.Second)
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	entries := []struct {
		name, body string
		dir        bool
	}{{"proj/", "", true}, {"proj/main.py", "print('hi')\n", false}, {"proj/sub/", "", true}, {"proj/sub/data.txt", "data", false}}
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
		if e.dir {
			hdr.Typeflag, hdr.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	dst := filepath.Join(dir, "tar-dst", "proj")
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(dst)) })
	if err := client.Untar(ctx, dst, &archive); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "sub", "data.txt")); err != nil || string(b) != "data" {
		t.Fatalf("untarred file: %q %v", b, err)
	}
	var back bytes.Buffer
	if err := client.Tar(ctx, dst, &back); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&back)
	got := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[strings.TrimSuffix(hdr.Name, "/")] = string(b)
	}
	if got["proj/main.py"] != "print('hi')\n" || got["proj/sub/data.txt"] != "data" {
		t.Errorf("tar of the tree: %v", got)
	}
}

// TestEgressRelay: a connection to the agent's egress port reaches the host side
// unexamined, both ways.
func TestEgressRelay(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	egressTargetMu.Lock()
	egressTarget = ln.Addr().String()
	egressTargetMu.Unlock()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err == nil {
			_, _ = c.Write(append([]byte("echo:"), buf...))
		}
	}()
	_, out, errOut := execOut(t, guest.Request{Cmd: []string{"python3", "-c", fmt.Sprintf(`
import socket
s = socket.create_connection(("127.0.0.1", %s), timeout=10)
s.sendall(b"hello")
print(s.recv(100).decode(), end="")
`, strings.Split(egressListen, ":")[1])}}, guest.ExecOptions{})
	if out != "echo:hello" {
		t.Errorf("relayed reply %q (stderr %q), want echo:hello", out, errOut)
	}
}

// TestCommandStreams checks what a command is started with: the OOM killer's first
// choice (oom_score_adj 1000, inherited by what it starts), and an empty stdin when the
// client sends none.
func TestCommandStreams(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	// The agent raises the score just after the command is exec'd (Go can run nothing in
	// the child before exec), so the command's very first instructions may still see 0;
	// what it starts a moment later inherits 1000.
	res, out, _ := execOut(t, guest.Request{Cmd: []string{"sh", "-c", "sleep 0.05; cat /proc/self/oom_score_adj"}}, guest.ExecOptions{})
	if res.ExitCode != 0 || out != "1000\n" {
		t.Errorf("oom_score_adj: exit %d %q, want 1000", res.ExitCode, out)
	}
	res, out, _ = execOut(t, guest.Request{Cmd: []string{"wc", "-c"}}, guest.ExecOptions{})
	if res.ExitCode != 0 || strings.TrimSpace(out) != "0" {
		t.Errorf("stdin: exit %d %q, want 0 bytes read", res.ExitCode, out)
	}
}

// TestOOMFirstReachesEarlyChildren: what a command starts before the agent has raised
// its score (a shell forks its program at once; under load the agent raises the shell's
// score milliseconds later) is raised too, so that it is the OOM killer's choice over the
// agent, not a tie with it. The raise is held here until the shell has forked, so the race
// is certain; the child then waits, bounded, for its own score to change and prints it.
func TestOOMFirstReachesEarlyChildren(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	defer server.SetBeforeOOMFirst(func(pid int) {
		children := fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if b, _ := os.ReadFile(children); len(strings.TrimSpace(string(b))) > 0 {
				return
			}
		}
	})()
	script := `(i=0; while [ "$(cat /proc/self/oom_score_adj)" != 1000 ] && [ $i -lt 300 ]; do i=$((i+1)); sleep 0.01; done; cat /proc/self/oom_score_adj) & wait`
	res, out, _ := execOut(t, guest.Request{Cmd: []string{"sh", "-c", script}}, guest.ExecOptions{})
	if res.ExitCode != 0 || out != "1000\n" {
		t.Errorf("the score of what a command started before its own was raised: exit %d %q, want 1000", res.ExitCode, out)
	}
}

// TestExecLeavesNoDescriptors runs commands every way their streams are made (stdin or
// none, started or not) and checks that the agent holds no more descriptors after.
func TestExecLeavesNoDescriptors(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	count := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	run := func() {
		execOut(t, guest.Request{Cmd: []string{"true"}}, guest.ExecOptions{})
		execOut(t, guest.Request{Cmd: []string{"cat"}}, guest.ExecOptions{Stdin: strings.NewReader("in")})
		execOut(t, guest.Request{Cmd: []string{"no-such-program-here"}}, guest.ExecOptions{})
		execOut(t, guest.Request{Cmd: []string{"/"}}, guest.ExecOptions{})
	}
	run() // the first exec opens what the agent keeps for good (/dev/null, the OOM counter)
	before := count()
	for i := 0; i < 10; i++ {
		run()
	}
	// The agent closes its end of a connection just after the result it sent.
	deadline := time.Now().Add(2 * time.Second)
	for count() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := count(); after > before {
		t.Errorf("%d descriptors open after 40 commands, %d before", after, before)
	}
}

// TestStartedFrame checks that a foreground command's client hears its pid before
// anything else of it: with the result of a command that ends at once, with the first
// output of one that prints, and soon after the start of one that runs silent.
func TestStartedFrame(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	type event struct {
		what string
		at   time.Duration
	}
	run := func(cmd ...string) ([]event, guest.Result) {
		t.Helper()
		var events []event
		var mu sync.Mutex
		start := time.Now()
		add := func(what string) {
			mu.Lock()
			events = append(events, event{what, time.Since(start)})
			mu.Unlock()
		}
		var startedPID int
		res, err := client.Exec(ctxT(t, 30*time.Second), guest.Request{Cmd: cmd}, guest.ExecOptions{
			Started: func(st guest.Started) { startedPID = st.PID; add("started") },
			Stdout:  writerFunc(func(p []byte) { add("stdout") }),
		})
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		if startedPID != res.PID {
			t.Errorf("%q: started with pid %d, the result says %d", cmd, startedPID, res.PID)
		}
		return events, res
	}
	if ev, _ := run("true"); len(ev) != 1 || ev[0].what != "started" {
		t.Errorf("true: %v, want started", ev)
	}
	if ev, _ := run("sh", "-c", "echo hi; sleep 0.3"); len(ev) != 2 || ev[0].what != "started" || ev[1].what != "stdout" {
		t.Errorf("echo: %v, want started, stdout", ev)
	}
	ev, _ := run("sleep", "0.5")
	if len(ev) != 1 || ev[0].what != "started" || ev[0].at > 250*time.Millisecond {
		t.Errorf("sleep 0.5: %v, want started within 250ms", ev)
	}
}

type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }
