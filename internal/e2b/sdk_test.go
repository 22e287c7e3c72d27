package e2b_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/cli/full"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/e2b"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kubernetes"
	"github.com/roche-sandbox/roche/provider/oci"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithAgent(m)) }

// served is a roched with its E2B listener, in the test's process, serving Docker.
type served struct {
	d   *daemon.Daemon
	env map[string]string // E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY as printed
	dp  *docker.Provider
	// printed is what roched printed at start, socket its unix socket.
	printed, socket string
	cfg             daemon.Config // as started
}

// lockedBuffer is what roched prints, read while it may still write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serve starts roched with --e2b-listen on a free loopback port, and checks that every
// sandbox made through it is gone when the test ends.
func serve(t *testing.T, cfg daemon.Config, more ...map[string]roche.Provider) *served {
	t.Helper()
	dp, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dp.Ping(ctx); err != nil {
		dp.Close()
		t.Fatal(err)
	}
	dir := testenv.ShortDir(t)
	cfg.Socket = filepath.Join(dir, "roched.sock")
	if cfg.E2BListen == "" {
		cfg.E2BListen = "tcp://127.0.0.1:0"
	}
	var out lockedBuffer
	providers := map[string]roche.Provider{"docker": dp}
	for _, m := range more {
		maps.Copy(providers, m)
	}
	d, err := daemon.New(cfg, providers, daemon.WithFrontend(e2b.New, &out))
	if err != nil {
		dp.Close()
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		dp.Close()
		t.Fatal(err)
	}
	s := &served{d: d, dp: dp, env: map[string]string{}, printed: out.String(), socket: cfg.Socket, cfg: cfg}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// After the shutdown, which waits for the removals roched's destroys started (a
		// kill answers before its sandbox is gone); it keeps live sandboxes for a restart.
		if err := d.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		// Whatever a failed script left: destroyed here, by id, and only this daemon's.
		for _, p := range providers {
			list, _ := p.List(ctx)
			for _, sb := range list {
				if sb.Owner == d.OwnerOf(e2b.LocalTenant) {
					t.Errorf("sandbox %s survived the test", sb.ID)
					_ = p.Destroy(ctx, sb.ID)
				}
			}
		}
		dp.Close()
	})
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "export ")
		if !ok {
			t.Fatalf("roched printed %q, not an export line", sc.Text())
		}
		k, v, _ := strings.Cut(line, "=")
		s.env[k] = v
	}
	for _, k := range []string{"E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"} {
		if s.env[k] == "" {
			t.Fatalf("roched printed no %s: %q", k, out.String())
		}
	}
	return s
}

// sdks installs the pinned SDKs (scripts/e2b-sdks.sh, idempotent) and returns what it
// printed: E2B_PYTHON, E2B_NODE_DIR.
func sdks(t *testing.T) map[string]string {
	t.Helper()
	cmd := exec.Command("bash", "../../scripts/e2b-sdks.sh")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/e2b-sdks.sh: %v", err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		m[k] = v
	}
	return m
}

// sdkEnv is the environment the SDK scripts run with: E2B's three variables and what a
// process needs to start, nothing else of the test's.
func (s *served) sdkEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "LANG=C.UTF-8"}
	for k, v := range s.env {
		env = append(env, k+"="+v)
	}
	return env
}

// run runs an SDK script in a network namespace of its own (testdata/netns.py), where
// only the listener's address leads anywhere, forwarded to roched's listener through a
// unix socket, and fails the test when the script sent a packet anywhere else (a DNS
// query, E2B's cloud, telemetry).
func (s *served) run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := testenv.ShortDir(t)
	sock := filepath.Join(dir, "e2b.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := s.d.FrontendAddr().String()
	var conns sync.WaitGroup
	defer conns.Wait()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				u, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(addr)
	report := filepath.Join(dir, "packets")
	argv := append([]string{"--net", "--", "python3", "testdata/netns.py", sock, port, report, "--", name}, args...)
	cmd := exec.CommandContext(ctx, "unshare", argv...)
	cmd.Env = s.sdkEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if b, rerr := os.ReadFile(report); rerr == nil && len(b) > 0 {
		t.Errorf("%s %s sent packets to other addresses than roched's listener:\n%s", name, strings.Join(args, " "), b)
	} else if rerr != nil && err == nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

// sdkVersion is one end of the tested range of E2B's SDKs (docs/e2b.md): the key of
// scripts/e2b-sdks.sh's line that names where it is installed.
type sdkVersion struct{ name, python, node string }

var sdkVersions = []sdkVersion{
	{"newest", "E2B_PYTHON", "E2B_NODE_DIR"},
	{"oldest", "E2B_PYTHON_OLDEST", "E2B_NODE_OLDEST_DIR"},
}

// TestPythonSDK runs the README quick starts of E2B's Python SDKs verbatim, and a script
// of their documented calls, against roched's E2B listener on Docker: the newest and the
// oldest releases of the tested range, on one roched.
func TestPythonSDK(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.Python)
	installed := sdks(t)
	s := serve(t, daemon.Config{})
	// roche e2b env prints what roched printed at start.
	var stdout, stderr bytes.Buffer
	if code := cli.Main([]string{"--socket", s.socket, "e2b", "env"}, strings.NewReader(""), &stdout, &stderr, full.Local{}); code != 0 || stdout.String() != s.printed {
		t.Errorf("roche e2b env: exit %d, printed %q (stderr %q), want roched's %q", code, stdout.String(), stderr.String(), s.printed)
	}
	for _, v := range sdkVersions {
		t.Run(v.name, func(t *testing.T) {
			py := installed[v.python]
			if out := s.run(t, py, "testdata/python/quickstart_e2b.py"); out != "Hello from E2B!\n\n" {
				t.Errorf("e2b quick start printed %q, want the README's Hello from E2B!", out)
			}
			if out := s.run(t, py, "testdata/python/quickstart_code_interpreter.py"); out != "2\n" {
				t.Errorf("code interpreter quick start printed %q, want the README's 2", out)
			}
			out := s.run(t, py, "testdata/python/sdk_calls.py", "pause")
			if !strings.HasSuffix(out, "all ok\n") || !strings.Contains(out, "ok connect resumes\n") {
				t.Errorf("sdk_calls.py did not end with all ok:\n%s", out)
			}
			t.Logf("sdk_calls.py:\n%s", out)
		})
	}
}

// killAll kills, through the listener, the sandboxes of roched's own key: those the
// JavaScript quick starts leave (they end without kill, the sandboxes to their timeout).
func (s *served) killAll(t *testing.T) int {
	t.Helper()
	key := map[string]string{"X-API-Key": s.env["E2B_API_KEY"]}
	r := call(t, "GET", s.env["E2B_API_URL"]+"/v2/sandboxes", key, "")
	var list []struct{ SandboxID string }
	if err := json.Unmarshal([]byte(r.body), &list); err != nil || r.status != 200 {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	for _, sb := range list {
		if r := call(t, "DELETE", s.env["E2B_API_URL"]+"/sandboxes/"+sb.SandboxID, key, ""); r.status != 204 {
			t.Errorf("kill %s: %d %s", sb.SandboxID, r.status, r.body)
		}
	}
	return len(list)
}

// TestNodeSDK runs the README quick starts of E2B's JavaScript SDKs verbatim, and a
// script of their documented calls, against roched's E2B listener on Docker: the newest
// and the oldest releases of the tested range, on one roched.
func TestNodeSDK(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.Node, testenv.Python)
	installed := sdks(t)
	s := serve(t, daemon.Config{})
	for _, v := range sdkVersions {
		t.Run(v.name, func(t *testing.T) {
			dir := installed[v.node]
			if out := s.run(t, "node", filepath.Join(dir, "quickstart_e2b.js")); out != "Hello from E2B!\n\n" {
				t.Errorf("e2b quick start printed %q, want the README's Hello from E2B!", out)
			}
			if out := s.run(t, "node", filepath.Join(dir, "quickstart_code_interpreter.js")); out != "2\n" {
				t.Errorf("code interpreter quick start printed %q, want the README's 2", out)
			}
			if n := s.killAll(t); n != 2 {
				t.Errorf("the two quick starts left %d sandboxes, want their 2", n)
			}
			out := s.run(t, "node", filepath.Join(dir, "sdk_calls.js"))
			if !strings.HasSuffix(out, "all ok\n") {
				t.Errorf("sdk_calls.js did not end with all ok:\n%s", out)
			}
			t.Logf("sdk_calls.js:\n%s", out)
		})
	}
}

// TestPythonSDKOnProviders runs the documented calls of E2B's newest Python SDKs with
// E2B's templates, named in the config file's "e2b" section, on the oci provider (crun or
// runc, no Docker in the path) and on gVisor (the docker provider on Docker's runsc
// runtime, as roched --runtime runsc serves it): pause and resume too, which both can do;
// on gVisor, which has no code contexts, run_code answers E2B's error shape.
func TestPythonSDKOnProviders(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.Python) // images come from Docker's store
	py := sdks(t)["E2B_PYTHON"]
	cases := []struct {
		name, provider string
		args           []string // sdk_calls.py's: what the provider cannot do
		open           func(t *testing.T) roche.Provider
	}{
		{"oci", "oci", nil, func(t *testing.T) roche.Provider {
			state := "/run/roche-test/oci-e2b"
			if err := os.MkdirAll(state, 0o700); err != nil {
				t.Fatal(err)
			}
			op, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				op.Close()
				if err := unix.Unmount(state, 0); err != nil && !errors.Is(err, unix.EINVAL) {
					t.Errorf("unmounting the state directory's tmpfs: %v", err)
				}
				os.RemoveAll(state)
			})
			return op
		}},
		// No code contexts on gVisor (docs/code-contexts.md): run_code answers 501.
		{"gvisor", "docker", []string{"nocode"}, func(t *testing.T) roche.Provider { // in serve's docker's place
			gp, err := docker.New(docker.WithRuntime(docker.RuntimeGVisor))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { gp.Close() })
			return gp
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.open(t) // serve's clean-up checks that its sandboxes are gone
			settings := fmt.Sprintf(`{"templates": {"base": {"image": "roche/python:local", "provider": %[1]q},
				"code-interpreter-v1": {"image": "roche/python:local", "provider": %[1]q}}}`, c.provider)
			s := serve(t, daemon.Config{E2B: json.RawMessage(settings)}, map[string]roche.Provider{c.provider: p})
			out := s.run(t, py, append([]string{"testdata/python/sdk_calls.py", "pause"}, c.args...)...)
			if !strings.HasSuffix(out, "all ok\n") || !strings.Contains(out, "ok connect resumes\n") {
				t.Errorf("sdk_calls.py did not end with all ok:\n%s", out)
			}
			if slices.Contains(c.args, "nocode") && !strings.Contains(out, "ok run_code refused in E2B's error shape\n") {
				t.Errorf("sdk_calls.py nocode did not check run_code's refusal:\n%s", out)
			}
		})
	}
}

// TestSDKOnKubernetes runs the documented calls of E2B's newest Python and JavaScript SDKs
// with E2B's templates on the kubernetes provider (the test cluster), on one roched:
// pause, which the provider cannot do, answers E2B's error shape.
func TestSDKOnKubernetes(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.Cluster, testenv.Python, testenv.Node)
	installed := sdks(t)
	cluster := testcluster.Start(t)
	cl := cluster.Client(t)
	t.Cleanup(cl.Close)
	ns := cl.Namespace(t, "roche-e2b")
	if !cluster.HasImage("roche/python:local") {
		testcluster.ImportDocker(t, "roche/python:local")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "agent.tar"))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := kubernetes.WriteAgentImage(f, os.Getenv("ROCHE_AGENT"))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !cluster.HasImage(ref) {
		testcluster.ImportTar(t, f.Name())
	}
	kp, err := kubernetes.New(kubernetes.WithKubeconfig(cluster.Kubeconfig), kubernetes.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kp.Close() })
	// disk 0: the kubelet bounds a writable root by eviction, which Roche does not take for
	// a disk limit (docs/providers/kubernetes.md).
	settings := `{"templates": {"base": {"image": "roche/python:local", "provider": "kubernetes", "disk": "0"},
		"code-interpreter-v1": {"image": "roche/python:local", "provider": "kubernetes", "disk": "0"}}}`
	s := serve(t, daemon.Config{E2B: json.RawMessage(settings)}, map[string]roche.Provider{"kubernetes": kp})
	out := s.run(t, installed["E2B_PYTHON"], "testdata/python/sdk_calls.py", "nopause", "noextend")
	if !strings.HasSuffix(out, "all ok\n") || !strings.Contains(out, "ok pause refused in E2B's error shape\n") {
		t.Errorf("sdk_calls.py did not end with all ok:\n%s", out)
	}
	out = s.run(t, "node", filepath.Join(installed["E2B_NODE_DIR"], "sdk_calls.js"), "noextend")
	if !strings.HasSuffix(out, "all ok\n") {
		t.Errorf("sdk_calls.js did not end with all ok:\n%s", out)
	}
}
