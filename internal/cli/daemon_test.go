package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	rocheclient "github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
)

// socketDir is a short temporary directory: unix socket paths are limited to 108 bytes.
var socketDir = testenv.ShortDir

// startInProcessDaemon serves roched in this process with a pool for the test image.
func startInProcessDaemon(t *testing.T) (socket string, c *rocheclient.Client) {
	t.Helper()
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=1")
	if err != nil {
		t.Fatal(err)
	}
	s := daemontest.Serve(t, daemon.Config{Pools: []pool.Spec{spec}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.Client.PoolWarmup(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	return s.Socket, s.Client
}

func poolHits(t *testing.T, c *rocheclient.Client) uint64 {
	t.Helper()
	st, err := c.PoolStatus(context.Background())
	if err != nil || len(st) != 1 {
		t.Fatalf("pool status: %v %v", st, err)
	}
	return st[0].Hits
}

// TestJSONErrorRetryHint: a create roched's pool refuses at once (its queue would make it
// wait past the pool's wait) says on its --json error line how long to wait before
// asking again, as the message does.
func TestJSONErrorRetryHint(t *testing.T) {
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=1&max=1&queue=1&wait=0.001")
	if err != nil {
		t.Fatal(err)
	}
	s := daemontest.Serve(t, daemon.Config{Pools: []pool.Spec{spec}})
	img := testImage()
	// A create takes the pool's one sandbox or finds it making the next, which takes
	// longer than 1 ms: within a few creates in a row, one is refused.
	for range 5 {
		r := run(t, "--socket", s.Socket, "create", "--json", "--image", img)
		if r.code == 0 {
			var info struct{ ID string }
			if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || info.ID == "" {
				t.Fatalf("create --json: %+v", r)
			}
			defer run(t, "--socket", s.Socket, "destroy", info.ID)
			continue
		}
		var got struct {
			Error struct {
				Reason, Message string
				RetryAfterMs    int64 `json:"retry_after_ms"`
			}
		}
		if err := json.Unmarshal([]byte(r.stderr), &got); err != nil || strings.Count(r.stderr, "\n") != 1 {
			t.Fatalf("refused create --json: %+v, want one JSON line", r)
		}
		e := got.Error
		if e.Reason != "exhausted" || e.RetryAfterMs <= 0 || !strings.Contains(e.Message, "retry in") {
			t.Fatalf("refused create --json: %+v, want reason exhausted and a positive retry_after_ms", e)
		}
		t.Logf("refused: retry after %d ms: %s", e.RetryAfterMs, e.Message)
		return
	}
	t.Fatal("no create was refused in five tries")
}

// TestDaemonMode: with roched answering on --socket (or ROCHE_SOCKET) the CLI goes
// through it, served from its pool; --direct bypasses it.
func TestDaemonMode(t *testing.T) {
	socket, c := startInProcessDaemon(t)
	img := testImage()

	r := run(t, "--socket", socket, "run", "--image", img, "--", "python3", "-c", "print('hello')")
	if r.code != 0 || r.stdout != "hello\n" || r.stderr != "" {
		t.Fatalf("run through roched: %+v", r)
	}
	if hits := poolHits(t, c); hits != 1 {
		t.Fatalf("run through roched: %d pool hits, want 1", hits)
	}

	// The whole lifecycle through the daemon, with ROCHE_SOCKET instead of the flag.
	t.Setenv("ROCHE_SOCKET", socket)
	r = run(t, "create", "--image", img, "--env", "GREETING=from the pool", "--workdir", "/tmp")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("create: %+v", r)
	}
	defer run(t, "destroy", id)
	if r := run(t, "exec", "--sandbox", id, "--", "sh", "-c", "echo $GREETING; pwd"); r.code != 0 || r.stdout != "from the pool\n/tmp\n" {
		t.Fatalf("exec in a pooled sandbox: %+v", r)
	}
	if r := rocheIn(t, "piped\n", "exec", "-i", "--sandbox", id, "--", "cat"); r.code != 0 || r.stdout != "piped\n" {
		t.Fatalf("exec -i: %+v", r)
	}
	if r := run(t, "exec", "--sandbox", id, "--", "sh", "-c", "exit 7"); r.code != 7 {
		t.Fatalf("exit status through roched: %+v", r)
	}
	r = run(t, "list", "--json", "--provider", "docker")
	var list []roche.SandboxInfo
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || !containsID(list, id) {
		t.Fatalf("list: %+v (%v)", r, err)
	}
	if r := run(t, "destroy", id); r.code != 0 || strings.TrimSpace(r.stdout) != id {
		t.Fatalf("destroy: %+v", r)
	}
	if r := run(t, "exec", "--sandbox", id, "--", "true"); r.code != 125 || !strings.Contains(r.stderr, "no sandbox") {
		t.Fatalf("exec after destroy: %+v", r)
	}

	hits := poolHits(t, c)
	if r := run(t, "--direct", "run", "--image", img, "--", "python3", "-c", "print('direct')"); r.code != 0 || r.stdout != "direct\n" {
		t.Fatalf("--direct run: %+v", r)
	}
	if poolHits(t, c) != hits {
		t.Fatal("--direct went through roched")
	}

	// Pools and status.
	r = run(t, "pool", "status", "--json")
	var pools []*rochev1.Pool
	if err := json.Unmarshal([]byte(r.stdout), &pools); err != nil || len(pools) != 1 || pools[0].Key != "docker/"+img {
		t.Fatalf("pool status --json: %+v (%v)", r, err)
	}
	if r := run(t, "pool", "status"); r.code != 0 || !strings.Contains(r.stdout, "docker/"+img) || !strings.Contains(r.stdout, "HITS") {
		t.Fatalf("pool status: %+v", r)
	}
	if r := run(t, "pool", "drain"); r.code != 0 || !strings.Contains(r.stdout, "destroyed") {
		t.Fatalf("pool drain: %+v", r)
	}
	if r := run(t, "pool", "warmup", "docker/"+img, "--count", "1"); r.code != 0 || !strings.Contains(r.stdout, "ready") {
		t.Fatalf("pool warmup: %+v", r)
	}
	if r := run(t, "daemon", "status"); r.code != 0 || !strings.Contains(r.stdout, "running on "+socket) {
		t.Fatalf("daemon status: %+v", r)
	}
	if r := run(t, "pool", "warmup", "docker/none:none"); r.code != 1 || !strings.Contains(r.stderr, "no pool docker/none:none") {
		t.Fatalf("warmup of an unknown pool: %+v", r)
	}
}

func containsID(list []roche.SandboxInfo, id string) bool {
	for _, sb := range list {
		if sb.ID == id {
			return true
		}
	}
	return false
}

// TestNoDaemon: without a daemon, daemon-only commands say how to start one, in one
// line; everything else works directly.
func TestNoDaemon(t *testing.T) {
	socket := filepath.Join(socketDir(t), "none.sock")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"daemon", "status"}, "roched is not running on " + socket + ": start it with roche daemon start"},
		{[]string{"pool", "status"}, "roche daemon start --pool"},
		{[]string{"pool", "drain"}, "roche daemon start --pool"},
		{[]string{"--direct", "pool", "status"}, "drop --direct"},
		{[]string{"pool", "warmup", "--count", "-1"}, "roched is not running"},
		{[]string{"daemon"}, "give a subcommand"},
		{[]string{"daemon", "start", "--roched", "/no/such/roched"}, "starting /no/such/roched"},
	}
	for _, c := range cases {
		r := run(t, append([]string{"--socket", socket}, c.args...)...)
		if r.code != 1 || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "roche: ") || !strings.Contains(r.stderr, c.want) {
			t.Errorf("roche %v: %+v, want one line saying %q", c.args, r, c.want)
		}
	}
	if r := run(t, "--socket", socket, "daemon", "stop"); r.code != 0 || !strings.Contains(r.stdout, "not running") {
		t.Errorf("daemon stop without a daemon: %+v", r)
	}
	for _, cmd := range [][]string{{"daemon", "start"}, {"daemon", "stop"}, {"daemon", "status"}, {"pool", "status"}, {"pool", "warmup"}, {"pool", "drain"}} {
		r := run(t, append(cmd, "--help")...)
		if r.code != 0 || !strings.Contains(r.stdout, "Examples:") {
			t.Errorf("roche %v --help: %+v", cmd, r)
		}
	}
}

// TestDaemonStartStop starts a real roched with roche daemon start (this test binary
// doubles as roched), uses it, and stops it; its pool's sandboxes, made from an image
// tag of their own, are all gone afterwards.
func TestDaemonStartStop(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dc, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	b := make([]byte, 4)
	rand.Read(b)
	img := "roche/python:cli-" + hex.EncodeToString(b)
	if err := dc.ImageTag(context.Background(), testImage(), img); err != nil {
		t.Fatalf("tagging %s: %v", testImage(), err)
	}
	mine := func() int {
		list, err := dc.ContainerList(context.Background(), container.ListOptions{
			All: true, Filters: filters.NewArgs(filters.Arg("label", "roche.managed=true")),
		})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range list {
			if c.Image == img {
				n++
			}
		}
		return n
	}
	dir := socketDir(t)
	socket := filepath.Join(dir, "roched.sock")
	logFile := filepath.Join(dir, "roched.log")
	t.Setenv("ROCHED_TEST_AS_DAEMON", "1")
	defer func() {
		if r := run(t, "--socket", socket, "daemon", "stop"); r.code != 0 {
			t.Errorf("cleanup stop: %+v", r)
		}
		if n := mine(); n != 0 {
			t.Errorf("%d containers survived roche daemon stop", n)
		}
		dc.ImageRemove(context.Background(), img, image.RemoveOptions{})
	}()

	// With TCP, the token goes by file: never on roched's command line.
	tokenFile := filepath.Join(dir, "token")
	tb := make([]byte, 16)
	rand.Read(tb)
	token := hex.EncodeToString(tb)
	os.WriteFile(tokenFile, []byte(token), 0o600)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := run(t, "--socket", socket, "daemon", "start", "--roched", os.Args[0], "--log", logFile,
		"--pool", "docker/"+img+"?min=2", "--listen", "tcp://"+addr, "--token-file", tokenFile, "--", "--log-level", "debug")
	if r.code != 0 || !strings.Contains(r.stdout, "roched started on "+socket) {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("daemon start: %+v\n%s", r, log)
	}
	var pid int
	fmt.Sscanf(r.stdout[strings.Index(r.stdout, "(pid "):], "(pid %d", &pid)
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || bytes.Contains(cmdline, []byte(token)) ||
		!bytes.Contains(cmdline, []byte(tokenFile)) {
		t.Fatalf("roched's command line %q (%v): want the token file, not the token", cmdline, err)
	}
	tc, err := rocheclient.New(rocheclient.WithAddress("http://"+addr), rocheclient.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if _, err := tc.Provider("docker").List(context.Background()); err != nil {
		t.Fatalf("a TCP client with the token: %v", err)
	}
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v, want mode 0600", fi, err)
	}
	if r := run(t, "--socket", socket, "daemon", "start", "--roched", os.Args[0]); r.code != 0 || !strings.Contains(r.stdout, "already running") {
		t.Fatalf("second start: %+v", r)
	}
	if r := run(t, "--socket", socket, "pool", "warmup"); r.code != 0 {
		t.Fatalf("warmup: %+v", r)
	}
	if r := run(t, "--socket", socket, "run", "--image", img, "--", "python3", "-c", "print('via roched')"); r.code != 0 || r.stdout != "via roched\n" {
		t.Fatalf("run: %+v", r)
	}
	r = run(t, "--socket", socket, "daemon", "status", "--json")
	var st struct {
		PID   int            `json:"pid"`
		Pools []rochev1.Pool `json:"pools"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.PID == 0 || len(st.Pools) != 1 || st.Pools[0].Hits != 1 {
		t.Fatalf("status --json: %+v (%v)", r, err)
	}
	if r := run(t, "--socket", socket, "daemon", "stop"); r.code != 0 || !strings.Contains(r.stdout, "roched stopped") {
		t.Fatalf("stop: %+v", r)
	}
	if _, err := os.Stat(socket); err == nil {
		t.Fatal("the socket outlived roched")
	}
	if n := mine(); n != 0 {
		t.Fatalf("%d pool containers survived a graceful stop", n)
	}
	if log, _ := os.ReadFile(logFile); !strings.Contains(string(log), "roched stopped") {
		t.Fatalf("log lacks the stop:\n%s", log)
	}
}
