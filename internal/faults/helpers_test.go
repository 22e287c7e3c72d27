package faults

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// dockerSocket is the real engine's socket.
const dockerSocket = "/var/run/docker.sock"

// binDir holds roche, roched and roche-agent built from this checkout.
var binDir string

// frozenPID is dockerd's pid while a test has it stopped, else 0.
var frozenPID atomic.Int64

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// The roched processes these tests start serve the direct-mode sandboxes of this
	// owner alone (--direct-owner's default), none that other tests make with roche.
	os.Setenv("ROCHE_OWNER", fmt.Sprintf("cli:faults-test-%d", os.Getpid()))
	// Whatever ends this process, a frozen dockerd is thawed first (the tests' own
	// cleanups, and a watchdog process, see freezeDockerd, cover the other ways out).
	defer thawDockerd()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		thawDockerd()
		os.Exit(1)
	}()

	dir, err := os.MkdirTemp("", "roche-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agent, err := testenv.BuildAgent(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Setenv("ROCHE_AGENT", agent)
	if _, _, err := testenv.BuildCLI(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	binDir = dir
	return m.Run()
}

func thawDockerd() {
	if pid := frozenPID.Swap(0); pid > 0 {
		_ = syscall.Kill(int(pid), syscall.SIGCONT)
	}
}

// freezeDockerd stops the dockerd of pid with SIGSTOP and returns the function that
// continues it (SIGCONT), which also runs at the test's cleanup (including after a
// panic). A watchdog process of its own continues dockerd after at most max even if this
// test binary dies first (a test timeout exits without running cleanups). Only a private
// dockerd is ever frozen: make test's streams share the real one.
func freezeDockerd(t *testing.T, pid int, max time.Duration) (thaw func()) {
	t.Helper()
	watchdog := exec.Command("sh", "-c", fmt.Sprintf("sleep %d; kill -CONT %d", int(max.Seconds()), pid))
	watchdog.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := watchdog.Start(); err != nil {
		t.Fatalf("starting the watchdog that thaws dockerd: %v", err)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			frozenPID.Store(0)
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("continuing dockerd (pid %d): %v", pid, err)
			}
			// The watchdog's process group: its shell and its sleep.
			_ = syscall.Kill(-watchdog.Process.Pid, syscall.SIGKILL)
			_ = watchdog.Wait()
		})
	}
	t.Cleanup(thaw)
	frozenPID.Store(int64(pid))
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		thaw()
		t.Fatalf("stopping dockerd (pid %d): %v", pid, err)
	}
	// The signal stops each thread as it next runs: wait until all have stopped, so that
	// nothing the test sends next can still be answered.
	deadline := time.Now().Add(5 * time.Second)
	for !allStopped(pid) {
		if time.Now().After(deadline) {
			thaw()
			t.Fatalf("dockerd (pid %d) did not stop within 5 s of SIGSTOP", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("dockerd (pid %d) frozen; it is continued at the end of the test, or by a watchdog after %v", pid, max)
	return thaw
}

// allStopped reports whether every thread of pid is stopped (state T).
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || len(stat) < i+3 || stat[i+2] != 'T' {
			return false
		}
	}
	return true
}

// silentSocket is an engine socket that accepts connections and never answers, as a
// frozen or wedged engine does.
func silentSocket(t *testing.T) string {
	return testenv.SilentSocket(t, filepath.Join(shortDir(t), "engine.sock"))
}

// engineProxy stands in front of the real engine and passes requests on, except that it
// can hang: every request (the engine frozen), or the requests a rule picks, either
// without passing them on (the engine never sees them) or after passing them on (the
// engine does the work; its answer never comes back).
type engineProxy struct {
	socket string
	rp     *httputil.ReverseProxy
	srv    *http.Server

	mu       sync.Mutex
	all      bool
	drop     func(*http.Request) bool // never passed on, never answered
	withhold func(*http.Request) bool // passed on, never answered
}

func newEngineProxy(t *testing.T) *engineProxy {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	p := &engineProxy{socket: filepath.Join(shortDir(t), "proxy.sock")}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "http", "docker"
		},
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", dockerSocket)
		}},
		FlushInterval: -1,
		ErrorLog:      nil,
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	p.srv = &http.Server{Handler: p}
	go p.srv.Serve(l)
	t.Cleanup(func() {
		p.srv.Close()
		// The agent directories of sandboxes made through this address (which names
		// their engine): a create cut short by the proxy leaves its directory for a
		// later sweep through the same address, which never comes once it is gone (a
		// one-shot roche exits before its background removal). The containers are the
		// shared engine's, and the tests see them removed.
		if err := os.RemoveAll(agentRootOf("unix://" + p.socket)); err != nil {
			t.Errorf("removing the agent directories made through the engine proxy: %v", err)
		}
	})
	return p
}

func (p *engineProxy) set(all bool, drop, withhold func(*http.Request) bool) {
	p.mu.Lock()
	p.all, p.drop, p.withhold = all, drop, withhold
	p.mu.Unlock()
}

func (p *engineProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	all, drop, withhold := p.all, p.drop, p.withhold
	p.mu.Unlock()
	switch {
	case all || drop != nil && drop(r):
		<-r.Context().Done()
	case withhold != nil && withhold(r):
		p.rp.ServeHTTP(httptest.NewRecorder(), r.WithContext(context.WithoutCancel(r.Context())))
		<-r.Context().Done()
	default:
		p.rp.ServeHTTP(w, r)
	}
}

// request rules for the proxy.
func isCreate(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/containers/create")
}

func isStart(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasPrefix(pathAfterVersion(r), "/containers/") && strings.HasSuffix(r.URL.Path, "/start")
}

func isRemove(r *http.Request) bool {
	return r.Method == http.MethodDelete && strings.HasPrefix(pathAfterVersion(r), "/containers/")
}

// pathAfterVersion strips the API version: /v1.41/containers/x → /containers/x.
func pathAfterVersion(r *http.Request) string {
	p := r.URL.Path
	if strings.HasPrefix(p, "/v") {
		if i := strings.Index(p[1:], "/"); i >= 0 {
			return p[i+1:]
		}
	}
	return p
}

// shortDir is a temporary directory with a short path: a unix socket path must fit in
// 108 bytes.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "rf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// privateImage is a tag of the test image only this test uses, so that the sandboxes
// made from it can be counted exactly while other tests share the engine.
func privateImage(t *testing.T) string {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	tag, untag, err := testenv.PrivateImage(context.Background(), "faults")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(untag)
	return tag
}

// realProvider is the Docker provider on the real engine, whatever DOCKER_HOST a test
// sets later.
func realProvider(t *testing.T) *docker.Provider {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	c, err := docker.New(docker.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sandboxesFrom lists the sandboxes made from img, straight from the real engine.
func sandboxesFrom(t *testing.T, real *docker.Provider, img string) []roche.SandboxInfo {
	t.Helper()
	list, err := real.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []roche.SandboxInfo
	for _, sb := range list {
		if sb.Image == img {
			out = append(out, sb)
		}
	}
	return out
}

// noneLeft waits until no sandbox made from img exists (the engine may still be
// finishing a removal), failing after d, and removes any it finds then.
func noneLeft(t *testing.T, real *docker.Provider, img string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := sandboxesFrom(t, real, img)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, sb := range left {
				_ = real.Destroy(context.Background(), sb.ID)
			}
			t.Fatalf("%d sandboxes from %s were left behind: %+v", len(left), img, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// within runs f and fails the test unless it returned within bound (plus margin for a
// loaded machine); it returns how long f took.
func within(t *testing.T, what string, bound time.Duration, f func()) time.Duration {
	t.Helper()
	start := time.Now()
	f()
	el := time.Since(start)
	if el > bound+margin {
		t.Errorf("%s took %v, over its bound of %v (+%v margin)", what, el.Round(time.Millisecond), bound, margin)
	}
	return el
}

// margin is what a deadline may be late by on a loaded, shared machine.
const margin = 3 * time.Second

// notAnswering checks err is the one-line error naming the engine at addr.
func notAnswering(t *testing.T, what string, err error, addr string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", what)
		return
	}
	msg := err.Error()
	if !strings.Contains(msg, "the Docker engine at "+addr) || !strings.Contains(msg, "is not answering") || strings.Contains(msg, "\n") {
		t.Errorf("%s: %q, want one line saying the Docker engine at %s is not answering", what, msg, addr)
	}
}

// result is what a roche process did.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// runRoche runs bin/roche with args and the extra environment, and a hard limit so that a
// hang fails the test instead of stalling it.
func runRoche(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "roche"), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
		}
	}()
	_ = cmd.Wait()
	close(done)
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
}

// noDaemon is the environment of a roche that finds no roched.
func noDaemon(t *testing.T) []string {
	return []string{"ROCHE_SOCKET=" + filepath.Join(shortDir(t), "none.sock")}
}

// testLogger collects a component's log, shown when the test fails.
func testLogger(t *testing.T) *slog.Logger {
	l, _ := testLog(t)
	return l
}

// testLog is testLogger, also returning what it collects.
func testLog(t *testing.T) (*slog.Logger, *syncBuffer) {
	t.Helper()
	buf := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() && buf.String() != "" {
			t.Logf("log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// strLines counts the lines of s.
func strLines(s string) int { return strings.Count(strings.TrimSuffix(s, "\n"), "\n") + 1 }

// The shared test helpers (internal/testenv), under this package's names.
var eventually = testenv.Eventually

type syncBuffer = testenv.SyncBuffer
