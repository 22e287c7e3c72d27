package docker_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// sandbox creates a sandbox destroyed at the end of the test.
func sandbox(t *testing.T, p *docker.Provider, cfg roche.Config) string {
	t.Helper()
	info, err := p.Create(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(context.Background(), info.ID) })
	return info.ID
}

func execOK(t *testing.T, p *docker.Provider, id string, cmd ...string) string {
	t.Helper()
	res, err := p.Exec(context.Background(), id, roche.ExecRequest{Cmd: cmd, Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v: %+v %v", cmd, res, err)
	}
	return res.Stdout
}

func TestFilesLargeBinaryRoundTrip(t *testing.T) {
	p := newProvider(t)
	cfg := testConfig()
	cfg.Writable = true // 100 MiB does not fit the 64 MiB /tmp
	id := sandbox(t, p, cfg)
	ctx := context.Background()

	data := make([]byte, 100<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	if err := p.WriteFile(ctx, id, "/var/tmp/big.bin", bytes.NewReader(data), 0o600); err != nil {
		t.Fatalf("WriteFile 100 MiB: %v", err)
	}
	inside := execOK(t, p, id, "python3", "-c", "import hashlib; print(hashlib.sha256(open('/var/tmp/big.bin','rb').read()).hexdigest())")
	if strings.TrimSpace(inside) != hexSum(want) {
		t.Fatalf("sha256 inside %s, want %s", inside, hexSum(want))
	}
	h := sha256.New()
	if err := p.ReadFile(ctx, id, "/var/tmp/big.bin", h); err != nil {
		t.Fatalf("ReadFile 100 MiB: %v", err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
		t.Fatal("100 MiB read back differs")
	}

	// And through cp's archive path, both ways.
	dir := t.TempDir()
	src := filepath.Join(dir, "big.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.CopyTo(ctx, id, src, "/var/tmp/copied.bin"); err != nil {
		t.Fatalf("CopyTo: %v", err)
	}
	out := filepath.Join(dir, "back.bin")
	if err := p.CopyFrom(ctx, id, "/var/tmp/copied.bin", out); err != nil {
		t.Fatalf("CopyFrom: %v", err)
	}
	back, err := os.ReadFile(out)
	if err != nil || sha256.Sum256(back) != want {
		t.Fatalf("copied 100 MiB back differs (%v)", err)
	}
}

func hexSum(b [32]byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 64)
	for i, c := range b {
		out[2*i], out[2*i+1] = digits[c>>4], digits[c&15]
	}
	return string(out)
}

func TestFilesAPI(t *testing.T) {
	p := newProvider(t)
	id := sandbox(t, p, testConfig())
	ctx := context.Background()

	t.Run("EmptyFile", func(t *testing.T) {
		if err := p.WriteFile(ctx, id, "/tmp/empty", strings.NewReader(""), 0o644); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := p.ReadFile(ctx, id, "/tmp/empty", &buf); err != nil || buf.Len() != 0 {
			t.Fatalf("read %d bytes, %v", buf.Len(), err)
		}
		if fi, err := p.Stat(ctx, id, "/tmp/empty"); err != nil || fi.Size != 0 || fi.IsDir {
			t.Fatalf("stat %+v %v", fi, err)
		}
	})
	t.Run("NestedPathWithParents", func(t *testing.T) {
		if err := p.WriteFile(ctx, id, "/tmp/a/b/c/deep.txt", strings.NewReader("deep"), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := execOK(t, p, id, "cat", "/tmp/a/b/c/deep.txt"); got != "deep" {
			t.Fatalf("read inside: %q", got)
		}
		// Files made through the API belong to the sandbox user, like its own.
		if got := execOK(t, p, id, "sh", "-c", `[ "$(stat -c %u:%g /tmp/a/b/c/deep.txt)" = "$(id -u):$(id -g)" ] && echo mine`); got != "mine\n" {
			t.Fatalf("owner %q, want the sandbox user", got)
		}
		if err := p.Mkdir(ctx, id, "/tmp/x/y"); err != nil {
			t.Fatal(err)
		}
		list, err := p.ListDir(ctx, id, "/tmp/a/b")
		if err != nil || len(list) != 1 || list[0].Name != "c" || !list[0].IsDir {
			t.Fatalf("list /tmp/a/b: %+v %v", list, err)
		}
		if err := p.Rename(ctx, id, "/tmp/a/b/c/deep.txt", "/tmp/x/y/moved.txt"); err != nil {
			t.Fatal(err)
		}
		if err := p.Remove(ctx, id, "/tmp/a"); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Stat(ctx, id, "/tmp/a"); !errors.Is(err, roche.ErrNotFound) {
			t.Fatalf("stat after remove: %v, want ErrNotFound", err)
		}
		var buf bytes.Buffer
		if err := p.ReadFile(ctx, id, "/tmp/x/y/moved.txt", &buf); err != nil || buf.String() != "deep" {
			t.Fatalf("renamed file: %q %v", buf.String(), err)
		}
	})
	t.Run("DotDotRefused", func(t *testing.T) {
		for _, path := range []string{"/tmp/../../etc/passwd", "/tmp/../etc/shadow", "tmp/relative"} {
			err := p.WriteFile(ctx, id, path, strings.NewReader("x"), 0o644)
			if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), path) {
				t.Errorf("write %s: %v, want a clear refusal", path, err)
			}
			if err := p.ReadFile(ctx, id, path, io.Discard); err == nil {
				t.Errorf("read %s succeeded", path)
			}
		}
	})
	t.Run("SymlinkEscapesRefused", func(t *testing.T) {
		execOK(t, p, id, "ln", "-s", "/etc", "/tmp/etc-link")
		execOK(t, p, id, "ln", "-s", "/etc/passwd", "/tmp/passwd-link")
		err := p.WriteFile(ctx, id, "/tmp/etc-link/roche", strings.NewReader("x"), 0o644)
		if !errors.Is(err, roche.ErrPermission) || !strings.Contains(err.Error(), "symlink") {
			t.Errorf("write through a directory symlink: %v, want a refusal naming the symlink", err)
		}
		for _, path := range []string{"/tmp/passwd-link", "/tmp/etc-link/passwd"} {
			if err := p.ReadFile(ctx, id, path, io.Discard); !errors.Is(err, roche.ErrPermission) || !strings.Contains(err.Error(), "symlink") {
				t.Errorf("read %s: %v, want a refusal naming the symlink", path, err)
			}
		}
		// A symlink inside an archive cannot carry later entries out of the target either.
		dir := t.TempDir()
		os.Symlink("/etc", filepath.Join(dir, "link"))
		if err := p.CopyTo(ctx, id, dir, "/tmp/unpacked"); err != nil {
			t.Fatalf("copying a directory holding a symlink: %v", err)
		}
		if got := execOK(t, p, id, "readlink", "/tmp/unpacked/link"); strings.TrimSpace(got) != "/etc" {
			t.Fatalf("symlink copied as %q", got)
		}
	})
	t.Run("ReadOnlyRootRefused", func(t *testing.T) {
		err := p.WriteFile(ctx, id, "/etc/roche-was-here", strings.NewReader("x"), 0o644)
		if !errors.Is(err, roche.ErrPermission) || !strings.Contains(err.Error(), "read-only") {
			t.Fatalf("write onto the read-only root: %v, want a refusal saying read-only", err)
		}
	})
	t.Run("OtherUsersFilesRefused", func(t *testing.T) {
		// /etc/shadow is root's: the files API has the sandbox user's rights, no more.
		if err := p.ReadFile(ctx, id, "/etc/shadow", io.Discard); !errors.Is(err, roche.ErrPermission) {
			t.Fatalf("read /etc/shadow: %v, want ErrPermission", err)
		}
	})
}

// TestSandboxUserCannotReachAgent tries, from inside, every way to the control channel.
func TestSandboxUserCannotReachAgent(t *testing.T) {
	p := newProvider(t)
	id := sandbox(t, p, testConfig())
	got := execOK(t, p, id, "python3", "-c", `
import os, socket
def attempt(name, fn):
    try:
        fn(); print(name, 'OPEN')
    except OSError as e:
        print(name, 'refused', type(e).__name__)
attempt('connect', lambda: socket.socket(socket.AF_UNIX).connect('/.roche/run/agent.sock'))
attempt('listdir', lambda: os.listdir('/.roche/run'))
attempt('fds', lambda: os.listdir('/proc/1/fd'))
attempt('environ', lambda: open('/proc/1/environ').read())
attempt('root', lambda: os.listdir('/proc/1/root/.roche/run'))
attempt('kill', lambda: os.kill(1, 15))
`)
	if strings.Contains(got, "OPEN") {
		t.Fatalf("the sandbox user reached the agent:\n%s", got)
	}
	if n := strings.Count(got, "refused"); n != 6 {
		t.Fatalf("expected 6 refusals:\n%s", got)
	}
	// The agent still answers the host after all that.
	if out := execOK(t, p, id, "echo", "ok"); out != "ok\n" {
		t.Fatalf("after the attempts: %q", out)
	}
}

func TestBackgroundProcesses(t *testing.T) {
	p := newProvider(t)
	id := sandbox(t, p, testConfig())
	ctx := context.Background()
	cmd, err := p.StartCommand(ctx, id, roche.CommandRequest{Cmd: []string{"sh", "-c", "echo first; sleep 1; echo second; exit 4"}})
	if err != nil {
		t.Fatal(err)
	}
	list, err := p.Commands(ctx, id)
	if err != nil || len(list) != 1 || list[0].PID != cmd.PID || !list[0].Running {
		t.Fatalf("commands: %+v %v", list, err)
	}
	sel := roche.CommandSelector{PID: cmd.PID}
	// Reconnect, then detach early: the command goes on.
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	early, _, err := providertest.FollowCommand(actx, t, p, id, sel, roche.CommandOffsets{})
	cancel()
	if err == nil || early.Stdout.String() != "first\n" {
		t.Fatalf("early connect: %s %v, want the first line then a detach", early, err)
	}
	out, end, err := providertest.FollowCommand(ctx, t, p, id, sel, roche.CommandOffsets{})
	if err != nil || end.ExitCode != 4 || out.Stdout.String() != "first\nsecond\n" {
		t.Fatalf("connect: %+v %s %v", end, out, err)
	}

	// Signal a long-running one.
	cmd, err = p.StartCommand(ctx, id, roche.CommandRequest{Cmd: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	sel = roche.CommandSelector{PID: cmd.PID}
	if err := p.SignalCommand(ctx, id, sel, 15); err != nil {
		t.Fatal(err)
	}
	_, end, err = providertest.FollowCommand(ctx, t, p, id, sel, roche.CommandOffsets{})
	if err != nil || end.ExitCode != 128+15 || end.Signal != 15 {
		t.Fatalf("after SIGTERM: %+v %v, want exit 143 by signal 15", end, err)
	}
	if err := p.SignalCommand(ctx, id, roche.CommandSelector{PID: 99999}, 15); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("signal to no process: %v", err)
	}
}

// TestForegroundCommandDiesWithClient: when the caller goes away mid-command, the command
// and its children are killed (a background one is not; see above).
func TestForegroundCommandDiesWithClient(t *testing.T) {
	p := newProvider(t)
	id := sandbox(t, p, testConfig())
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	go func() {
		w := &signalWriter{c: started}
		p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo go; sleep 300 # roche-orphan-marker"}, Stdout: w})
	}()
	<-started
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := execOK(t, p, id, "sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
		if !strings.Contains(strings.ReplaceAll(out, "cat /proc", ""), "sleep 300") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("command survived its client:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type signalWriter struct {
	c    chan struct{}
	done bool
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if !w.done {
		w.done = true
		close(w.c)
	}
	return len(p), nil
}

// TestAgentThatCannotStartIsAnError: an agent that cannot start is an error quoting why
// and saying how to ask for Docker's exec API, never a sandbox that silently works
// another way; nothing is left behind.
func TestAgentThatCannotStartIsAnError(t *testing.T) {
	p := newProvider(t, docker.WithAgentPath("/bin/false"))
	tag, untag, err := testenv.PrivateImage(context.Background(), "agent-test")
	if err != nil {
		t.Fatal(err)
	}
	defer untag()
	cfg := testConfig()
	cfg.Image = tag
	_, err = p.Create(context.Background(), cfg)
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "roche-agent did not start") ||
		!strings.Contains(err.Error(), "container exited") || !strings.Contains(err.Error(), "--transport docker-exec") {
		t.Fatalf("create with an agent that cannot start: %v", err)
	}
	t.Log(err)
	// The engine may still be finishing the removal (auto-remove races the undo).
	deadline := time.Now().Add(10 * time.Second)
	for n := containersFrom(t, p, tag); n != 0; n = containersFrom(t, p, tag) {
		if time.Now().After(deadline) {
			t.Fatalf("the failed create left %d containers", n)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// No agent binary at all is the same.
	p = newProvider(t, docker.WithAgentPath(""))
	if _, err := p.Create(context.Background(), testConfig()); !errors.Is(err, roche.ErrUnavailable) ||
		!strings.Contains(err.Error(), "roche-agent was not found") || !strings.Contains(err.Error(), "--transport docker-exec") {
		t.Fatalf("create without roche-agent: %v", err)
	}
}

// containersFrom counts the provider's sandboxes made from img.
func containersFrom(t *testing.T, p *docker.Provider, img string) int {
	t.Helper()
	list, err := p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sb := range list {
		if sb.Image == img {
			n++
		}
	}
	return n
}

// TestAgentFallback: asked for (WithExecFallback), a sandbox whose agent cannot start
// works through Docker's exec API, and says so.
func TestAgentFallback(t *testing.T) {
	p := newProvider(t, docker.WithAgentPath("/bin/false"), docker.WithExecFallback())
	start := time.Now()
	info, err := p.Create(context.Background(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(context.Background(), info.ID) })
	if info.Transport != docker.TransportDockerExec {
		t.Fatalf("transport %q, want %q", info.Transport, docker.TransportDockerExec)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("falling back took %v", el)
	}
	if got := execOK(t, p, info.ID, "echo", "fallback"); got != "fallback\n" {
		t.Fatalf("exec on the fallback: %q", got)
	}
	if listed, err := p.Inspect(context.Background(), info.ID); err != nil || listed.Transport != docker.TransportDockerExec {
		t.Fatalf("inspect: %+v %v", listed, err)
	}
	if err := p.WriteFile(context.Background(), info.ID, "/tmp/x", strings.NewReader("x"), 0o644); !errors.Is(err, roche.ErrUnsupported) {
		t.Fatalf("files API on the fallback: %v, want ErrUnsupported", err)
	}
}

// TestAgentSurvivesConcurrentForkBombs: fork bombs take every free PID, and the PID limit
// counts threads; the agent (PID 1) must not need one then, or it dies with the sandbox.
// Before agent.ThreadReserve, four bombs at once killed it.
func TestAgentSurvivesConcurrentForkBombs(t *testing.T) {
	p := newProvider(t)
	id := sandbox(t, p, testConfig())
	bomb := "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() {
			res, err := p.Exec(context.Background(), id, roche.ExecRequest{Cmd: []string{"python3", "-c", bomb}, Timeout: 3 * time.Second})
			if err == nil && !res.TimedOut && res.ExitCode == 0 {
				err = fmt.Errorf("a fork bomb ended on its own: %+v", res)
			}
			errs <- err
		}()
	}
	for i := 0; i < 4; i++ {
		if err := <-errs; err != nil {
			t.Errorf("fork bomb exec: %v", err)
		}
	}
	if got := execOK(t, p, id, "echo", "agent alive"); got != "agent alive\n" {
		t.Fatalf("after the bombs: %q", got)
	}
}

// TestExecAtTheLimits: a command at the documented maxima runs, argv and env made of
// the characters JSON escapes most ('<' becomes six bytes), so that no limit below them
// (the agent's frames, the kernel's execve) refuses what the limits allow.
func TestExecAtTheLimits(t *testing.T) {
	p := newProvider(t)
	id := sandbox(t, p, testConfig())
	arg := strings.Repeat("<", roche.MaxArgBytes)
	cmd := []string{"sh", "-c", `echo "$# ${#1} ${#BIG_0} ${#BIG_1}"`, "_"}
	for n := len("sh-c_") + len(cmd[2]); n+len(arg) <= roche.MaxArgvBytes; n += len(arg) {
		cmd = append(cmd, arg)
	}
	env := map[string]string{}
	for i := range 2 {
		k := fmt.Sprintf("BIG_%d", i)
		env[k] = strings.Repeat("<", roche.MaxEnvBytes/2-len(k)-1)
	}
	req := roche.ExecRequest{Cmd: cmd, Env: env}
	if err := req.Validate(); err != nil {
		t.Fatalf("the request is not within the limits: %v", err)
	}
	res, err := p.Exec(context.Background(), id, req)
	if err != nil {
		t.Fatalf("exec at the limits: %v", err)
	}
	want := fmt.Sprintf("%d %d %d %d\n", len(cmd)-4, roche.MaxArgBytes, len(env["BIG_0"]), len(env["BIG_1"]))
	if res.ExitCode != 0 || res.Stdout != want {
		t.Fatalf("exec at the limits: exit %d, stdout %q, stderr %q; want %q", res.ExitCode, res.Stdout, res.Stderr, want)
	}
}

// TestDestroyAfterTheEngineRemovedIt: a sandbox the engine removed on its own (killed, so
// auto-removed; its lifetime's end does the same) is destroyed without error, and its
// agent socket directory on the host goes with it, not left for a gc.
func TestDestroyAfterTheEngineRemovedIt(t *testing.T) {
	p := newProvider(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := sandbox(t, p, testConfig())
	dc := engineClient(t)
	c, err := dc.ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	dir := c.Config.Labels[docker.LabelAgentDir]
	if _, err := os.Stat(dir); dir == "" || err != nil {
		t.Fatalf("the sandbox's agent directory %q: %v", dir, err)
	}
	killedByTheEngine(ctx, t, dc, id)
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatalf("destroying a sandbox the engine removed: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("its agent directory %s is still there (%v)", dir, err)
	}
}

// TestCreateSweepsAgentDirsOfGoneSandboxes: a sandbox that ends with nobody of ours
// watching (its creator was killed, so its lease ended it; or it reached its lifetime
// with no roched running) is removed by the engine, which knows nothing of its agent
// directory. The next create on the engine, in any process, removes such a directory
// once its create has given up, and leaves live sandboxes' alone.
func TestCreateSweepsAgentDirsOfGoneSandboxes(t *testing.T) {
	state, err := os.MkdirTemp("", "rsweep")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The creator, which dies without a word: this provider is never asked again.
	creator := newProvider(t, docker.WithStateDir(state))
	gone := sandbox(t, creator, testConfig())
	dc := engineClient(t)
	c, err := dc.ContainerInspect(ctx, gone)
	if err != nil {
		t.Fatal(err)
	}
	goneDir := c.Config.Labels[docker.LabelAgentDir]
	killedByTheEngine(ctx, t, dc, gone)
	if _, err := os.Stat(goneDir); err != nil {
		t.Fatalf("the gone sandbox's agent directory %s should be there before the sweep: %v", goneDir, err)
	}
	// A live sandbox's directory, as old as the gone one's: both as if made an hour ago.
	other := newProvider(t, docker.WithStateDir(state))
	live := sandbox(t, other, testConfig())
	c, err = dc.ContainerInspect(ctx, live)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{goneDir, c.Config.Labels[docker.LabelAgentDir]} {
		ageAgentDir(t, dir, time.Hour)
	}

	// Another process's create.
	next := newProvider(t, docker.WithStateDir(state))
	sandbox(t, next, testConfig())
	for {
		if _, err := os.Stat(goneDir); os.IsNotExist(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the gone sandbox's agent directory %s is still there", goneDir)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := execOK(t, other, live, "echo", "alive"); got != "alive\n" {
		t.Fatalf("the live sandbox after the sweep: %q", got)
	}
}

// TestSweepSparesAnotherCreatorsDirectory: a create in another process, with a longer
// engine timeout than the sweeping one's, makes its sandbox's directory before its
// container; until its own deadline (recorded in the directory) a sweep leaves it,
// however old it looks.
func TestSweepSparesAnotherCreatorsDirectory(t *testing.T) {
	state, err := os.MkdirTemp("", "rsweep")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	p := newProvider(t, docker.WithStateDir(state))
	// A sandbox of this engine, for the directory of its engine.
	id := sandbox(t, p, testConfig())
	c, err := engineClient(t).ContainerInspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(c.Config.Labels[docker.LabelAgentDir])
	// Another creator's directory, whose container is not made yet: its deadline is a
	// minute away, and it last changed an hour ago.
	making := filepath.Join(root, "roche-0123456789ab")
	if err := os.Mkdir(making, 0o700); err != nil {
		t.Fatal(err)
	}
	by := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
	if err := os.WriteFile(filepath.Join(making, "start_by"), []byte(by), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(making, old, old)
	// And a leftover beside it, whose create gave up an hour ago.
	left := filepath.Join(root, "roche-ba9876543210")
	if err := os.Mkdir(left, 0o700); err != nil {
		t.Fatal(err)
	}
	ageAgentDir(t, left, time.Hour)
	if _, err := p.GC(context.Background(), roche.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("the leftover %s survived the sweep (%v)", left, err)
	}
	if _, err := os.Stat(making); err != nil {
		t.Fatalf("the sweep removed %s, whose create has not given up yet: %v", making, err)
	}
	os.RemoveAll(making)
}

// ageAgentDir makes a sandbox's agent directory look as if its create had given up, and
// the directory had last changed, d ago.
func ageAgentDir(t *testing.T, dir string, d time.Duration) {
	t.Helper()
	then := time.Now().Add(-d)
	if err := os.WriteFile(filepath.Join(dir, "start_by"), []byte(strconv.FormatInt(then.Unix(), 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dir, then, then); err != nil {
		t.Fatal(err)
	}
}

// killedByTheEngine kills a sandbox's container behind its provider's back and waits for
// the engine to remove it (auto-remove), as when its lease or lifetime ends.
func killedByTheEngine(ctx context.Context, t *testing.T, dc *client.Client, id string) {
	t.Helper()
	if err := dc.ContainerKill(ctx, id, "KILL"); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := dc.ContainerInspect(ctx, id); err != nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the engine did not remove the killed sandbox")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStateDirOfAnotherUserRefused: where another local user owns the directory the
// sockets would live under (as /tmp/roche-UID may be, taken first by anyone), that user
// could swap a sandbox's directory for one of their own and answer in its agent's
// place: the create is refused, saying why, and makes nothing.
func TestStateDirOfAnotherUserRefused(t *testing.T) {
	base := t.TempDir()
	taken := filepath.Join(base, "roche-1000")
	if err := os.Mkdir(taken, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(taken, 0o777)
	if err := os.Chown(taken, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, docker.WithStateDir(filepath.Join(taken, "docker")))
	owner := fmt.Sprintf("statedir-test-%d", time.Now().UnixNano())
	_, err := p.CreateFor(context.Background(), testConfig(), kit.CreateOptions{Owner: owner})
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("create under another user's directory: %v, want a refusal naming its owner", err)
	}
	list, err := p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.Owner == owner {
			p.Destroy(context.Background(), sb.ID)
			t.Fatalf("the refused create left sandbox %s", sb.ID)
		}
	}
	if entries, _ := os.ReadDir(taken); len(entries) > 0 {
		t.Fatalf("the refused create made %s in the other user's directory", entries[0].Name())
	}
}
