package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

func testImage() string { return testenv.Image() }

type result struct {
	code           int
	stdout, stderr string
}

func rocheIn(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, strings.NewReader(stdin), &out, &errb, testLocal)
	return result{code, out.String(), errb.String()}
}

func run(t *testing.T, args ...string) result {
	t.Helper()
	return rocheIn(t, "", args...)
}

// managed counts the containers labelled roche.managed=true made from this test
// process's private image tag (see TestMain), straight from the engine.
func managed(t *testing.T) int {
	t.Helper()
	c, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	list, err := c.ContainerList(context.Background(), container.ListOptions{
		All: true, Filters: filters.NewArgs(filters.Arg("label", "roche.managed=true")),
	})
	if err != nil {
		t.Fatalf("listing containers: %v (the README's test command starts dockerd)", err)
	}
	n := 0
	for _, c := range list {
		if c.Image == testImage() {
			n++
		}
	}
	return n
}

func TestRunHello(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	before := managed(t)
	r := run(t, "run", "--image", testImage(), "--", "python3", "-c", "print('hello')")
	if r.code != 0 || r.stdout != "hello\n" || r.stderr != "" {
		t.Fatalf("roche run: %+v", r)
	}
	if after := managed(t); after != before {
		t.Fatalf("roche run left %d containers behind", after-before)
	}
}

func TestRunExitCodes(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	img := testImage()
	if r := run(t, "run", "--image", img, "--", "sh", "-c", "echo out; echo err >&2; exit 7"); r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("exit 7: %+v", r)
	}
	// A timeout is reported as it was asked for, with how long the command ran,
	// measured in the sandbox: here at least the timeout.
	r := run(t, "run", "--image", img, "--exec-timeout", "1", "--", "python3", "-c", "while True: pass")
	var ran time.Duration
	if m := regexp.MustCompile(`after it ran (\S+)\n$`).FindStringSubmatch(r.stderr); m != nil {
		ran, _ = time.ParseDuration(m[1])
	}
	if r.code != exitCodeTimeout || !strings.Contains(r.stderr, "timed out: --exec-timeout 1s killed it") || ran < time.Second || ran > 30*time.Second {
		t.Errorf("timeout: %+v, want exit 124 naming --exec-timeout 1s, and a run of at least 1s", r)
	}
	// The sandbox's lifetime bounds a command too, counted from the create: said so.
	r = run(t, "run", "--image", img, "--timeout", "2", "--", "sleep", "30")
	if r.code != exitCodeTimeout || !strings.Contains(r.stderr, "the sandbox's lifetime ended (--timeout 2s, counted from its create; the command ran ") {
		t.Errorf("lifetime 2 s, sleep 30: %+v, want exit 124 naming --timeout 2s", r)
	}
}

// TestBadInput: every bad input gets one line on stderr that says what to do, a
// non-zero exit, and leaves nothing behind.
func TestBadInput(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	img := testImage()
	cases := []struct {
		name string
		args []string
		want string // in the message
	}{
		{"unknown sandbox", []string{"exec", "--sandbox", "0123456789ab", "--", "true"}, "listing your sandboxes shows the live ones"},
		{"unknown sandbox destroy", []string{"destroy", "0123456789ab"}, "no sandbox"},
		{"image not pullable", []string{"run", "--image", "roche/no-such-image:none", "--", "true"}, "run roche image build python (as root), then pass --image roche/python:local"},
		{"bad memory", []string{"run", "--image", img, "--memory", "512x", "--", "true"}, `"512x" is not a size`},
		{"bad disk", []string{"run", "--image", img, "--writable", "--disk", "lots", "--", "true"}, `disk: "lots" is not a size`},
		{"negative disk", []string{"run", "--image", img, "--writable", "--disk", "-1g", "--", "true"}, "negative"},
		{"huge disk", []string{"run", "--image", img, "--writable", "--disk", "2t", "--", "true"}, "1t maximum"},
		{"workspace size alone", []string{"run", "--image", img, "--workspace-size", "1g", "--", "true"}, "without a workspace"},
		{"negative timeout", []string{"run", "--image", img, "--timeout", "-5", "--", "true"}, "positive number of seconds"},
		{"negative exec timeout", []string{"run", "--image", img, "--exec-timeout", "-1", "--", "true"}, "negative"},
		{"missing mount", []string{"run", "--image", img, "--mount", "/no/such/host/path:/data", "--", "true"}, "does not exist on the host"},
		{"bad mount mode", []string{"run", "--image", img, "--mount", "/tmp:/data:rx", "--", "true"}, "neither ro nor rw"},
		{"empty command run", []string{"run", "--image", img, "--"}, "no command given"},
		{"empty command exec", []string{"exec", "--sandbox", "0123456789ab"}, "no command given"},
		{"no sandbox flag", []string{"exec", "--", "true"}, "--sandbox"},
		{"zero cpus", []string{"run", "--image", img, "--cpus", "0", "--", "true"}, "cpus is 0"},
		{"unknown provider", []string{"run", "--provider", "vmware", "--", "true"}, "choose one of"},
		{"unknown flag", []string{"run", "--bogus", "--", "true"}, "--help"},
		{"bad env", []string{"run", "--image", img, "--env", "NOVALUE", "--", "true"}, "KEY=VALUE"},
		{"cp without sandbox", []string{"cp", "a", "b"}, "ID:/path"},
		{"cp to a relative path", []string{"cp", "a", "0123456789ab:tmp/x"}, "must be absolute: 0123456789ab:/tmp/x"},
		{"cp cap not a size", []string{"cp", "--max-bytes", "lots", "a", "0123456789ab:/tmp/x"}, `--max-bytes: invalid config: "lots" is not a size`},
		{"cp cap of nothing", []string{"cp", "--max-bytes", "0", "a", "0123456789ab:/tmp/x"}, "--max-bytes: invalid config: 0 copies nothing"},
		{"cp without arguments", []string{"cp"}, "roche cp takes SRC DST, got none (usage: roche cp"},
		{"command's flags before --", []string{"run", "python3", "-c", "1"}, "put the command after --"},
		{"not a number", []string{"run", "--image", img, "--timeout", "abc", "--", "true"}, `--timeout "abc": want a whole number`},
		{"not a number of cpus", []string{"run", "--image", img, "--cpus", "two", "--", "true"}, `--cpus "two": want a number`},
	}
	before := managed(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := run(t, c.args...)
			if r.code == 0 {
				t.Fatalf("exit 0 for bad input: %+v", r)
			}
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "roche: ") {
				t.Fatalf("want exactly one line starting \"roche: \" on stderr, got %q", r.stderr)
			}
			if !strings.Contains(r.stderr, c.want) {
				t.Fatalf("message %q does not say %q", r.stderr, c.want)
			}
			if strings.Contains(r.stderr, "panic") || strings.Contains(r.stderr, "goroutine") {
				t.Fatalf("stack trace on stderr: %q", r.stderr)
			}
		})
	}
	if after := managed(t); after != before {
		t.Fatalf("bad input left %d containers behind", after-before)
	}
}

// TestJSONErrors: a command given --json reports its failure as one JSON object on
// stderr, naming the reason, so that programs need not match English.
func TestJSONErrors(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	img := testImage()
	cases := []struct {
		args         []string
		reason, want string
	}{
		{[]string{"create", "--json", "--image", img, "--memory", "512x"}, "invalid_config", `"512x" is not a size`},
		// A program (the SDKs' CLI transport) is told what to set, not which flag to pass.
		{[]string{"create", "--json", "--image", "roche/no-such-image:none"}, "image_not_found",
			`make it on the host that runs the sandboxes (roched's, when you use roched) with roche image build python (as root), then create sandboxes with image "roche/python:local"`},
		{[]string{"reset", "--json", "0123456789ab"}, "not_found", "0123456789ab"},
		{[]string{"list", "--json", "--provider", "vmware"}, "invalid_config", "choose one of"},
	}
	before := managed(t)
	for _, c := range cases {
		r := run(t, c.args...)
		var got struct {
			Error struct{ Reason, Message string }
		}
		if r.code == 0 || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 || json.Unmarshal([]byte(r.stderr), &got) != nil {
			t.Errorf("roche %s: %+v, want a non-zero exit and one JSON line on stderr", strings.Join(c.args, " "), r)
			continue
		}
		if got.Error.Reason != c.reason || !strings.Contains(got.Error.Message, c.want) || strings.Contains(got.Error.Message, "--image") {
			t.Errorf("roche %s: %+v, want reason %s and a message with %q", strings.Join(c.args, " "), got, c.reason, c.want)
		}
	}
	t.Run("engine down", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-docker.sock"))
		r := run(t, "create", "--json", "--image", img)
		if !strings.Contains(r.stderr, `"reason":"unavailable"`) || !strings.Contains(r.stderr, "dockerd") {
			t.Errorf("roche create --json with the engine down: %+v", r)
		}
	})
	if after := managed(t); after != before {
		t.Fatalf("bad input left %d containers behind", after-before)
	}
}

// TestVersion: roche --version says which build it is.
func TestVersion(t *testing.T) {
	r := run(t, "--version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "roche ") || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("roche --version: %+v", r)
	}
}

func TestEngineUnreachable(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-docker.sock"))
	r := run(t, "run", "--image", testImage(), "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, "not reachable") || !strings.Contains(r.stderr, "dockerd") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("engine down: %+v, want one line saying how to start dockerd", r)
	}
}

func TestLifecycle(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	r := run(t, "create", "--image", testImage(), "--json", "--env", "GREETING=hi there")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	var info roche.SandboxInfo
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || info.ID == "" || info.State != roche.StateRunning {
		t.Fatalf("create --json printed %q (%v)", r.stdout, err)
	}
	id := info.ID
	t.Cleanup(func() { run(t, "destroy", id) })

	if r := run(t, "exec", "--sandbox", id, "--", "sh", "-c", "echo $GREETING"); r.code != 0 || r.stdout != "hi there\n" {
		t.Fatalf("exec: %+v", r)
	}
	if r := rocheIn(t, "from stdin\n", "exec", "-i", "--sandbox", id, "--", "cat"); r.code != 0 || r.stdout != "from stdin\n" {
		t.Fatalf("exec -i: %+v", r)
	}
	r = run(t, "exec", "--json", "--sandbox", id, "--", "sh", "-c", "echo x; exit 3")
	var res roche.ExecResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 3 || res.ExitCode != 3 || res.Stdout != "x\n" {
		t.Fatalf("exec --json: %+v (%v)", r, err)
	}

	// cp both ways, with a nested destination created with its parents.
	dir := t.TempDir()
	src := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(src, []byte("payload\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "cp", src, id+":/tmp/a/b/in.txt"); r.code != 0 {
		t.Fatalf("cp in: %+v", r)
	}
	if r := run(t, "exec", "--sandbox", id, "--", "cat", "/tmp/a/b/in.txt"); r.stdout != "payload\n" {
		t.Fatalf("file copied in reads %+v", r)
	}
	out := filepath.Join(dir, "out.txt")
	if r := run(t, "cp", id+":/tmp/a/b/in.txt", out); r.code != 0 {
		t.Fatalf("cp out: %+v", r)
	}
	if b, _ := os.ReadFile(out); string(b) != "payload\n" {
		t.Fatalf("file copied out reads %q", b)
	}

	if r := run(t, "pause", id); r.code != 0 {
		t.Fatalf("pause: %+v", r)
	}
	r = run(t, "list", "--json")
	var list []roche.SandboxInfo
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("list --json printed %q: %v", r.stdout, err)
	}
	var state roche.SandboxState
	for _, sb := range list {
		if sb.ID == id {
			state = sb.State
		}
	}
	if state != roche.StatePaused {
		t.Fatalf("paused sandbox listed as %q", state)
	}
	if r := run(t, "unpause", id); r.code != 0 {
		t.Fatalf("unpause: %+v", r)
	}
	if r := run(t, "list"); !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "running") {
		t.Fatalf("list: %+v", r)
	}
	if r := run(t, "destroy", id); r.code != 0 || strings.TrimSpace(r.stdout) != id {
		t.Fatalf("destroy: %+v", r)
	}
	if r := run(t, "exec", "--sandbox", id, "--", "true"); r.code == 0 {
		t.Fatalf("exec after destroy succeeded: %+v", r)
	}
}

func TestGC(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	r := run(t, "create", "--image", testImage())
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { run(t, "destroy", id) })
	if r := run(t, "gc", "--dry-run", "--all"); !strings.Contains(r.stdout, "would remove "+id) {
		t.Fatalf("gc --dry-run --all: %+v", r)
	}
	if r := run(t, "gc"); strings.Contains(r.stdout, id) {
		t.Fatalf("gc removed a live, unexpired sandbox: %+v", r)
	}
	if r := run(t, "gc", "--all"); !strings.Contains(r.stdout, "removed "+id) {
		t.Fatalf("gc --all: %+v", r)
	}
	if r := run(t, "list"); strings.Contains(r.stdout, id) {
		t.Fatalf("sandbox still listed after gc --all: %+v", r)
	}
}

// TestLifetimeEndsSandboxWithoutDaemon: a sandbox whose caller vanished is gone once its
// lifetime ends, with no daemon or gc involved.
func TestLifetimeEndsSandboxWithoutDaemon(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	r := run(t, "create", "--image", testImage(), "--timeout", "2")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { run(t, "destroy", id) })
	deadline := time.Now().Add(30 * time.Second)
	for strings.Contains(run(t, "list").stdout, id) {
		if time.Now().After(deadline) {
			t.Fatal("sandbox with a 2 s lifetime still exists after 30 s")
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestRunInterrupted: Ctrl-C during roche run kills the command and destroys the sandbox.
func TestRunInterrupted(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	before := managed(t)
	cmd := exec.Command(os.Args[0], "run", "--image", testImage(), "--", "sh", "-c", "echo started; sleep 60")
	cmd.Env = append(os.Environ(), "ROCHE_TEST_AS_CLI=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := stdout.Read(buf); err != nil || string(buf[:n]) != "started\n" {
		t.Fatalf("waiting for the command to start: %q %v", buf[:n], err)
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("exit %d (%v) after Ctrl-C, want 130; stderr %q", code, err, stderr.String())
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("took %v to stop after Ctrl-C", el)
	}
	if after := managed(t); after != before {
		t.Fatalf("Ctrl-C left %d containers behind", after-before)
	}
}

func TestHelpHasExamples(t *testing.T) {
	for _, c := range []string{"create", "exec", "run", "destroy", "list", "gc", "cp", "pause", "unpause", "workspace", "reset", "snapshot"} {
		r := run(t, c, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "Examples:") || !strings.Contains(r.stdout, "roche "+c) {
			t.Errorf("roche %s --help: exit %d, no example:\n%s", c, r.code, r.stdout)
		}
	}
}

func TestRunAllowHost(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	ln, err := net.Listen("tcp", "127.0.0.10:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "allowed") })}
	go srv.Serve(ln)
	defer srv.Close()
	code := "import urllib.request, sys\nprint(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
	r := run(t, "run", "--direct", "--image", testImage(), "--allow-host", ln.Addr().String(), "--", "python3", "-c", code, "http://"+ln.Addr().String()+"/")
	if r.code != 0 || r.stdout != "allowed\n" {
		t.Fatalf("run --allow-host, allowed host: %+v", r)
	}
	r = run(t, "run", "--direct", "--image", testImage(), "--allow-host", ln.Addr().String(), "--", "python3", "-c", code, "http://127.0.0.11:1/")
	if r.code == 0 || !strings.Contains(r.stderr, "403") {
		t.Fatalf("run --allow-host, unlisted host: %+v", r)
	}
	r = run(t, "create", "--direct", "--image", testImage(), "--allow-host", "pypi.org")
	if r.code == 0 || !strings.Contains(r.stderr, "roched") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("create --direct --allow-host: %+v, want one line naming roched", r)
	}
}
