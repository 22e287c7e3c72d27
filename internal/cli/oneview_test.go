package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/defaults"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// listJSON is roche list --json's sandboxes by id.
func listJSON(t *testing.T, args ...string) map[string]roche.SandboxInfo {
	t.Helper()
	r := run(t, append(args, "list", "--json")...)
	var list []roche.SandboxInfo
	if err := json.Unmarshal([]byte(r.stdout), &list); r.code != 0 || err != nil {
		t.Fatalf("roche %v list --json: %+v (%v)", args, r, err)
	}
	out := map[string]roche.SandboxInfo{}
	for _, sb := range list {
		out[sb.ID] = sb
	}
	return out
}

// TestOneView: what a user makes with roche before starting roched is theirs through
// roched too, as the user did it: roche create with no roched running, a file copied
// in, then roche daemon start, and roche list shows the sandbox (with its own owner),
// roche exec runs in it (by id and by a prefix, with piped input), roche cp copies out
// of it and into it, roche shell and roche code run in it, roche reset replaces it with
// a sandbox still the user's, roche daemon stop leaves it to roche in direct mode and a
// restarted roched serves it again, roche destroy removes it, and after that every call
// says it is gone in words that hold.
func TestOneView(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := socketDir(t)
	socket := filepath.Join(dir, "roched.sock")
	logFile := filepath.Join(dir, "roched.log")
	img := testImage()
	owner := os.Getenv("ROCHE_OWNER")

	// No roched: the CLI runs the provider itself.
	r := run(t, "--socket", socket, "create", "--image", img)
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("create with no roched: %+v", r)
	}
	t.Cleanup(func() { run(t, "--direct", "destroy", id) })
	src := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(src, []byte("made before roched\n"), 0o644)
	if r := run(t, "--socket", socket, "cp", src, id+":/tmp/in.txt"); r.code != 0 {
		t.Fatalf("cp in with no roched: %+v", r)
	}

	t.Setenv("ROCHED_TEST_AS_DAEMON", "1")
	if r := run(t, "--socket", socket, "daemon", "start", "--roched", os.Args[0], "--log", logFile); r.code != 0 {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("daemon start: %+v\n%s", r, log)
	}
	t.Cleanup(func() {
		if r := run(t, "--socket", socket, "daemon", "stop"); r.code != 0 {
			t.Errorf("daemon stop: %+v", r)
		}
	})

	sb, ok := listJSON(t, "--socket", socket)[id]
	if !ok || sb.Owner != owner || sb.State != roche.StateRunning {
		t.Fatalf("roche list through roched: %+v (listed %v), want %s running with owner %s", sb, ok, id, owner)
	}
	if r := run(t, "--socket", socket, "list"); r.code != 0 || !strings.Contains(r.stdout, id[:12]) {
		t.Fatalf("roche list through roched: %+v, want %s", r, id[:12])
	}
	if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "cat", "/tmp/in.txt"); r.code != 0 || r.stdout != "made before roched\n" {
		t.Fatalf("exec through roched: %+v", r)
	}
	if r := rocheIn(t, "piped\n", "--socket", socket, "exec", "-i", "--sandbox", id[:12], "--", "cat"); r.code != 0 || r.stdout != "piped\n" {
		t.Fatalf("exec -i by a prefix through roched: %+v", r)
	}
	if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "sh", "-c", "exit 7"); r.code != 7 {
		t.Fatalf("an exit status through roched: %+v", r)
	}
	out := filepath.Join(t.TempDir(), "out.txt")
	if r := run(t, "--socket", socket, "cp", id+":/tmp/in.txt", out); r.code != 0 {
		t.Fatalf("cp out through roched: %+v", r)
	}
	if b, _ := os.ReadFile(out); string(b) != "made before roched\n" {
		t.Fatalf("cp out through roched copied %q", b)
	}
	if r := run(t, "--socket", socket, "cp", out, id+":/tmp/back.txt"); r.code != 0 {
		t.Fatalf("cp in through roched: %+v", r)
	}
	if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "cat", "/tmp/back.txt"); r.stdout != "made before roched\n" {
		t.Fatalf("the file copied in through roched: %+v", r)
	}
	// It went through roched, which says so in its log.
	if log, _ := os.ReadFile(logFile); !strings.Contains(string(log), "serving a sandbox its user made in direct mode") || !strings.Contains(string(log), id) {
		t.Fatalf("roched's log does not say it served %s:\n%s", id, log)
	}

	if r := rocheIn(t, "echo from-$((6*7))\n", "--socket", socket, "shell", id); r.code != 0 || !strings.Contains(r.stdout, "from-42") {
		t.Fatalf("shell through roched: %+v", r)
	}
	if r := run(t, "--socket", socket, "code", "--sandbox", id, "6 * 7"); r.code != 0 || r.stdout != "42\n" {
		t.Fatalf("code through roched: %+v", r)
	}
	// A reset makes a new sandbox in its place, still the user's from direct mode.
	r = run(t, "--socket", socket, "reset", id)
	was := id
	id = strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" || id == was {
		t.Fatalf("reset through roched: %+v", r)
	}
	t.Cleanup(func() { run(t, "--direct", "destroy", id) })
	if sb, ok := listJSON(t, "--socket", socket)[id]; !ok || sb.Owner != owner {
		t.Fatalf("after a reset through roched, roche list: %+v (listed %v), want %s with owner %s", sb, ok, id, owner)
	}
	if sb, ok := listJSON(t, "--direct")[id]; !ok || sb.Owner != owner {
		t.Fatalf("after a reset through roched, roche --direct list: %+v (listed %v), want %s, still the user's", sb, ok, id)
	}
	// roched stopped: nothing of it claims the sandbox (roche would refuse to act on one
	// of roched's without it), and a roched started again serves it again.
	if r := run(t, "--socket", socket, "daemon", "stop"); r.code != 0 {
		t.Fatalf("daemon stop: %+v", r)
	}
	if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "echo", "direct again"); r.code != 0 || r.stdout != "direct again\n" {
		t.Fatalf("exec with roched stopped: %+v", r)
	}
	if r := run(t, "--socket", socket, "daemon", "start", "--roched", os.Args[0], "--log", logFile); r.code != 0 {
		t.Fatalf("daemon start again: %+v", r)
	}
	if _, ok := listJSON(t, "--socket", socket)[id]; !ok {
		t.Fatalf("roche list through a restarted roched lacks %s", id)
	}

	if r := run(t, "--socket", socket, "destroy", id); r.code != 0 || strings.TrimSpace(r.stdout) != id {
		t.Fatalf("destroy through roched: %+v", r)
	}
	testenv.Eventually(t, time.Minute, "the sandbox to be gone in direct mode too", func() bool {
		_, ok := listJSON(t, "--direct")[id]
		return !ok
	})
	if _, ok := listJSON(t, "--socket", socket)[id]; ok {
		t.Fatal("roche list through roched still shows the destroyed sandbox")
	}
	r = run(t, "--socket", socket, "exec", "--sandbox", id, "--", "true")
	if r.code != exitRocheFailed || !strings.Contains(r.stderr, "no sandbox "+id) || strings.Contains(r.stderr, "roche list shows the live ones") {
		t.Fatalf("exec after destroy: %+v, want not found in words that hold", r)
	}
}

// TestOneViewIsTheUsersAlone attacks the one view from the side: root's direct-mode
// sandbox, with roched (root's) on a socket an operator opened to every local user and
// on TCP with a token. A second, unprivileged local user made for the test reaches
// roched (daemon status answers) and claims root's owner with ROCHE_OWNER, yet does not
// see the sandbox in roche list, and roche exec and roche destroy of it are "not found";
// a TCP tenant with the token is told the same. Root, on the same socket, sees and
// reaches it (the positive control), and it survives the attempts.
func TestOneViewIsTheUsersAlone(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	img := testImage()
	owner := os.Getenv("ROCHE_OWNER")
	r := run(t, "--direct", "create", "--image", img)
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("create: %+v", r)
	}
	t.Cleanup(func() { run(t, "--direct", "destroy", id) })

	name, uid, gid := testenv.LocalUser(t, "rt")

	dir := socketDir(t)
	os.Chmod(dir, 0o755)
	socket := filepath.Join(dir, "r.sock")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	token := rand.Text()
	daemontest.Serve(t, daemon.Config{Socket: socket, DirectOwner: owner, Listen: "tcp://" + addr, Token: token})
	// The operator opens the socket to everyone (its mode is 0600 otherwise, which alone
	// keeps other users out: TestSecondLocalUser).
	if err := os.Chmod(socket, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, ok := listJSON(t, "--socket", socket, "--provider", "docker")[id]; !ok {
		t.Fatalf("root does not see its direct sandbox %s through roched", id)
	}

	// The test binary, where the other user can run it as roche.
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(bin, "cli.test")
	if err := os.WriteFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	asOther := func(args ...string) result {
		t.Helper()
		cmd := exec.Command(exe, append([]string{"--socket", socket}, args...)...)
		cmd.Env = []string{"ROCHE_TEST_AS_CLI=1", "PATH=/usr/bin:/bin", "HOME=/nonexistent", "ROCHE_OWNER=" + owner}
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("running roche as %s: %v", name, err)
		}
		return result{code, stdout.String(), stderr.String()}
	}
	if r := asOther("daemon", "status"); r.code != 0 || !strings.Contains(r.stdout, "running on "+socket) {
		t.Fatalf("the other user does not reach roched (the attack would prove nothing): %+v", r)
	}
	if r := asOther("list", "--json", "--provider", "docker"); r.code != 0 || strings.Contains(r.stdout, id) {
		t.Errorf("the other user's roche list through roched: %+v, want it without root's %s", r, id)
	}
	if r := asOther("exec", "--sandbox", id, "--", "true"); r.code != exitRocheFailed || !strings.Contains(r.stderr, "no sandbox "+id) {
		t.Errorf("the other user's roche exec in root's sandbox: %+v, want not found", r)
	}
	if r := asOther("destroy", id); r.code == 0 || !strings.Contains(r.stderr, "no sandbox "+id) {
		t.Errorf("the other user's roche destroy of root's sandbox: %+v, want not found", r)
	}

	// A TCP tenant with the token.
	t.Setenv("ROCHE_ADDRESS", "http://"+addr)
	t.Setenv("ROCHE_TOKEN", token)
	if got := listJSON(t, "--provider", "docker"); len(got) != 0 {
		t.Errorf("a TCP tenant's roche list: %v, want nothing", got)
	}
	if r := run(t, "exec", "--sandbox", id, "--", "true"); r.code != exitRocheFailed || !strings.Contains(r.stderr, "no sandbox "+id) {
		t.Errorf("a TCP tenant's roche exec in root's sandbox: %+v, want not found", r)
	}
	if r := run(t, "destroy", id); r.code == 0 || !strings.Contains(r.stderr, "no sandbox "+id) {
		t.Errorf("a TCP tenant's roche destroy of root's sandbox: %+v, want not found", r)
	}
	os.Unsetenv("ROCHE_ADDRESS")
	os.Unsetenv("ROCHE_TOKEN")

	if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "echo", "still mine"); r.code != 0 || r.stdout != "still mine\n" {
		t.Fatalf("root's exec after the attempts: %+v", r)
	}
}

// TestOneViewKeepsTheLease: a sandbox that roche create --hold made and still holds (in
// direct mode: its lease is that process's) is served through roched, which started
// after it, and roched leaves it alone past the wait after which it destroys a leased
// sandbox of its own that nobody holds (FirstHold, 10 s): commands keep running in it.
// When its holder lets go, the holder destroys it, and roched stops serving it.
func TestOneViewKeepsTheLease(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	owner := os.Getenv("ROCHE_OWNER")
	socket := filepath.Join(socketDir(t), "roched.sock")
	holder := exec.Command(os.Args[0], "--socket", socket, "create", "--hold", "--image", testImage())
	holder.Env = append(os.Environ(), "ROCHE_TEST_AS_CLI=1")
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.SyncBuffer
	holder.Stderr = &stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = holder.Wait(); close(done) }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
		case <-time.After(time.Minute):
			holder.Process.Kill()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	id := strings.TrimSpace(line)
	if err != nil || id == "" {
		t.Fatalf("create --hold printed %q (%v): %s", line, err, stderr.String())
	}
	t.Cleanup(func() { run(t, "--direct", "destroy", id) })

	daemontest.Serve(t, daemon.Config{Socket: socket, DirectOwner: owner})
	if _, ok := listJSON(t, "--socket", socket, "--provider", "docker")[id]; !ok {
		t.Fatalf("roche list through roched lacks the held sandbox %s", id)
	}
	// Past FirstHold, with margin: each command must find it.
	for end := time.Now().Add(14 * time.Second); time.Now().Before(end); {
		if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "sleep", "1"); r.code != 0 {
			t.Fatalf("exec in the held sandbox through roched: %+v", r)
		}
	}
	if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "echo", "held"); r.code != 0 || r.stdout != "held\n" {
		t.Fatalf("exec after roched's FirstHold: %+v", r)
	}
	stdin.Close()
	select {
	case <-done:
		if waitErr != nil {
			t.Fatalf("the holder, let go: %v %s", waitErr, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("the holder did not end once its input closed")
	}
	if _, ok := listJSON(t, "--socket", socket, "--provider", "docker")[id]; ok {
		t.Fatal("roche list through roched still shows the sandbox its holder destroyed")
	}
	if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "true"); r.code != exitRocheFailed || !strings.Contains(r.stderr, id) {
		t.Fatalf("exec after its holder destroyed it: %+v", r)
	}
}

// TestOneViewEveryProvider: for every provider whose sandboxes outlive the roche that
// made them (each of them, wasm included: its sandboxes are directories), a sandbox
// made with roche create before roched runs is listed by roche list through roched, as
// the user's, runs roche exec, takes roche cp both ways, and goes with roche destroy;
// roched serves that provider alone on a private socket, in this process.
func TestOneViewEveryProvider(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.QEMU, testenv.PythonWasm, testenv.Cluster)
	owner := os.Getenv("ROCHE_OWNER")
	cases := []struct {
		provider string
		create   []string // besides --provider
		echo     []string // prints its one argument and a newline
		setup    func(t *testing.T) catalog.Options
	}{
		{provider: "docker", create: []string{"--image", testImage()}, echo: []string{"echo"}},
		{provider: "oci", create: []string{"--image", testImage()}, echo: []string{"echo"}},
		{provider: "qemu", create: []string{"--image", testImage()}, echo: []string{"echo"}},
		{provider: "wasm", echo: []string{"python3", "-c", "import sys; print(sys.argv[1])"}},
		{provider: "kubernetes", create: []string{"--image", "roche/python:local"}, echo: []string{"echo"},
			setup: func(t *testing.T) catalog.Options {
				cluster := testcluster.Start(t)
				cl := cluster.Client(t)
				t.Cleanup(cl.Close)
				ns := cl.Namespace(t, "roche-cli-oneview")
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
				t.Setenv("KUBECONFIG", cluster.Kubeconfig)
				return catalog.Options{Kubeconfig: cluster.Kubeconfig, Namespace: ns}
			}},
	}
	for _, c := range cases {
		t.Run(c.provider, func(t *testing.T) {
			var opts catalog.Options
			if c.setup != nil {
				opts = c.setup(t)
			}
			socket := filepath.Join(socketDir(t), "roched.sock")
			args := append([]string{"--socket", socket, "create", "--provider", c.provider}, c.create...)
			if opts.Namespace != "" {
				args = append(args, "--namespace", opts.Namespace)
			}
			r := run(t, args...)
			id := strings.TrimSpace(r.stdout)
			if r.code != 0 || id == "" {
				t.Fatalf("create with no roched: %+v", r)
			}
			direct := []string{"--direct"}
			if opts.Namespace != "" {
				direct = append(direct, "--namespace", opts.Namespace)
			}
			t.Cleanup(func() { run(t, append(direct, "destroy", id)...) })

			opts.EngineTimeout, opts.Transport = defaults.EngineTimeout, defaults.Transport
			p, err := testLocal.Open(c.provider, opts)
			if err != nil {
				t.Fatal(err)
			}
			d, err := daemon.New(daemon.Config{Socket: socket, DirectOwner: owner}, map[string]roche.Provider{c.provider: p})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			if err := d.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() {
				d.Shutdown(context.Background())
				catalog.Set{c.provider: p}.Close()
			}()

			via := []string{"--socket", socket, "--provider", c.provider}
			if sb, ok := listJSON(t, via...)[id]; !ok || sb.Owner != owner {
				t.Fatalf("roche list through roched: %+v (listed %v), want %s with owner %s", sb, ok, id, owner)
			}
			r = run(t, append([]string{"--socket", socket, "exec", "--sandbox", id, "--"}, append(c.echo, "through roched")...)...)
			if r.code != 0 || r.stdout != "through roched\n" {
				t.Fatalf("exec through roched: %+v", r)
			}
			src := filepath.Join(t.TempDir(), "in.txt")
			os.WriteFile(src, []byte("copied\n"), 0o644)
			if r := run(t, "--socket", socket, "cp", src, id+":/tmp/in.txt"); r.code != 0 {
				t.Fatalf("cp in through roched: %+v", r)
			}
			out := filepath.Join(t.TempDir(), "out.txt")
			if r := run(t, "--socket", socket, "cp", id+":/tmp/in.txt", out); r.code != 0 {
				t.Fatalf("cp out through roched: %+v", r)
			}
			if b, _ := os.ReadFile(out); string(b) != "copied\n" {
				t.Fatalf("a round trip through roched copied %q", b)
			}
			if r := run(t, "--socket", socket, "destroy", id); r.code != 0 || strings.TrimSpace(r.stdout) != id {
				t.Fatalf("destroy through roched: %+v", r)
			}
			testenv.Eventually(t, 2*time.Minute, "the sandbox to be gone", func() bool {
				_, err := p.Inspect(ctx, id)
				return errors.Is(err, roche.ErrNotFound)
			})
			if _, ok := listJSON(t, via...)[id]; ok {
				t.Fatal("roche list through roched still shows the destroyed sandbox")
			}
		})
	}
}

// TestOneViewSaysWhy: a sandbox the caller made in direct mode under an owner roched
// does not serve (roched's --direct-owner is another: ROCHE_OWNER differed, or roched
// runs as another user) is "not found" through roched, and roche says why and what
// reaches it (--direct), which does; a sandbox of someone else's gets no such note.
func TestOneViewSaysWhy(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	socket := filepath.Join(socketDir(t), "roched.sock")
	mine := os.Getenv("ROCHE_OWNER") + "-why"
	t.Setenv("ROCHE_OWNER", mine)
	r := run(t, "--socket", socket, "create", "--image", testImage())
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("create: %+v", r)
	}
	t.Cleanup(func() { run(t, "--direct", "destroy", id) })
	daemontest.Serve(t, daemon.Config{Socket: socket, DirectOwner: "cli:someone-else@elsewhere"})

	r = run(t, "--socket", socket, "exec", "--sandbox", id, "--", "true")
	if r.code != exitRocheFailed || !strings.Contains(r.stderr, "no sandbox "+id) ||
		!strings.Contains(r.stderr, "one you made in direct mode (owner "+mine+")") || !strings.Contains(r.stderr, "pass --direct") ||
		strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("exec through roched: %+v, want one line saying it is yours from direct mode and to pass --direct", r)
	}
	if r := run(t, "--socket", socket, "destroy", id); r.code != 1 || !strings.Contains(r.stderr, "pass --direct") {
		t.Fatalf("destroy through roched: %+v, want the same note", r)
	}
	if r := run(t, "--socket", socket, "--direct", "exec", "--sandbox", id, "--", "echo", "direct"); r.code != 0 || r.stdout != "direct\n" {
		t.Fatalf("exec --direct, as the note says: %+v", r)
	}
	t.Setenv("ROCHE_OWNER", mine+"-not")
	if r := run(t, "--socket", socket, "exec", "--sandbox", id, "--", "true"); r.code != exitRocheFailed || strings.Contains(r.stderr, "direct mode") {
		t.Fatalf("exec of another owner's sandbox through roched: %+v, want not found and no note", r)
	}
}
