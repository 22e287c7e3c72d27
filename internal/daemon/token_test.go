package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// writeToken writes a fresh token to a file only its owner can read.
func writeToken(t *testing.T, path string) string {
	t.Helper()
	tok := randomToken()
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestTokenNeverOnTheCommandLine runs roched as a process with --token-file and reads
// what every local user can: its command line. The token is not there (nor in its
// environment); a TCP client holding it is served, as the tenant "default". --token
// itself is refused, naming --token-file.
func TestTokenNeverOnTheCommandLine(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := shortDir(t)
	tokFile := filepath.Join(dir, "token")
	tok := writeToken(t, tokFile)
	addr := freeAddr(t)
	r := startRochedEnv(t, filepath.Join(dir, "r.sock"), nil, "--listen", "tcp://"+addr, "--token-file", tokFile)
	pid := r.cmd.Process.Pid
	for _, f := range []string{"cmdline", "environ"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(tok)) {
			t.Errorf("the token is in roched's /proc/%d/%s: %q", pid, f, b)
		}
	}
	c, err := client.New(client.WithAddress("http://"+addr), client.WithToken(tok))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxFor(t, time.Minute)
	p := c.Provider("docker")
	sb, err := p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatalf("a client with the token: %v\n%s", err, r.log)
	}
	if !strings.HasSuffix(sb.Owner, "/"+DefaultTenant) {
		t.Errorf("owner %q: want the tenant %q", sb.Owner, DefaultTenant)
	}
	if res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if err := p.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	stopRoched(t, r)

	var out, errb bytes.Buffer
	if code := Main([]string{"--socket", filepath.Join(dir, "s.sock"), "--listen", "tcp://" + addr, "--token", tok}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "--token-file") || strings.Contains(errb.String(), tok) {
		t.Fatalf("--token: exit %d, %q: want it refused naming --token-file, without echoing the token", code, errb.String())
	}
}

// TestHashToken: roched hash-token prints the token_sha256 a tokens file lists.
func TestHashToken(t *testing.T) {
	var f flags
	cmd := command(&f, io.Discard)
	var out bytes.Buffer
	cmd.SetIn(strings.NewReader("0123456789abcdef0123456789abcdef\n"))
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"hash-token"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out.String()), HashToken("0123456789abcdef0123456789abcdef"); got != want || len(got) != 64 {
		t.Fatalf("hash-token printed %q, want %q", got, want)
	}
	cmd.SetIn(strings.NewReader("short\n"))
	cmd.SetArgs([]string{"hash-token"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("a short token: %v", err)
	}
}

// otherUserReport is what the second local user could reach.
type otherUserReport struct {
	TokenFile string `json:"token_file"` // the error reading it
	Socket    string `json:"socket"`     // the error calling over it
	Cmdline   string `json:"cmdline"`    // roched's command line, which anyone reads
	Environ   string `json:"environ"`    // the error reading roched's environment
	TCP       string `json:"tcp"`        // the code of a call over TCP without the token
}

// otherUser runs as the second local user (see TestSecondLocalUser) and reports, as
// JSON on stdout, what it could reach: args are the token file, the socket, roched's
// pid and its TCP address.
func otherUser(args []string) int {
	var rep otherUserReport
	errText := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	_, err := os.ReadFile(args[0])
	rep.TokenFile = errText(err)
	c, _ := client.New(client.WithSocket(args[1]))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Provider("docker").List(ctx)
	rep.Socket = errText(err)
	c.Close()
	b, _ := os.ReadFile("/proc/" + args[2] + "/cmdline")
	rep.Cmdline = string(b)
	_, err = os.ReadFile("/proc/" + args[2] + "/environ")
	rep.Environ = errText(err)
	tc, _ := client.New(client.WithAddress("http://" + args[3]))
	_, err = tc.Provider("docker").List(ctx)
	rep.TCP = connectCode(err).String()
	tc.Close()
	json.NewEncoder(os.Stdout).Encode(rep)
	return 0
}

// TestSecondLocalUser: a second, unprivileged user on the machine (made for the test and
// removed after) can read roched's command line but finds no token in it, cannot read
// the token file or roched's environment, cannot call over the unix socket (its mode
// keeps it to roched's user), and over TCP without the token gets UNAUTHENTICATED.
func TestSecondLocalUser(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	name, uid, gid := testenv.LocalUser(t, "rt")

	// Everything in a directory anyone may enter, so that only roched's own guards
	// (the socket's mode, the token file's) stand in the way.
	dir := shortDir(t)
	os.Chmod(dir, 0o755)
	tokFile := filepath.Join(dir, "token")
	tok := writeToken(t, tokFile)
	socket := filepath.Join(dir, "r.sock")
	addr := freeAddr(t)
	r := startRochedEnv(t, socket, nil, "--listen", "tcp://"+addr, "--token-file", tokFile)
	defer stopRoched(t, r)

	// The test binary, where the other user can run it.
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(bin, "daemon.test")
	if err := os.WriteFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, tokFile, socket, strconv.Itoa(r.cmd.Process.Pid), addr)
	cmd.Env = []string{"ROCHED_TEST_AS_OTHER_USER=1", "PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("running as %s: %v\n%s", name, err, stderr.String())
	}
	var rep otherUserReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("report %q: %v", out, err)
	}
	t.Logf("as %s (uid %d): %+v", name, uid, rep)
	if !strings.Contains(rep.TokenFile, "permission denied") {
		t.Errorf("the other user reading the token file: %q, want permission denied", rep.TokenFile)
	}
	if !strings.Contains(rep.Socket, "permission denied") {
		t.Errorf("the other user calling over the unix socket: %q, want permission denied", rep.Socket)
	}
	if !strings.Contains(rep.Cmdline, "--token-file") || strings.Contains(rep.Cmdline, tok) {
		t.Errorf("roched's command line as the other user reads it: %q: want --token-file and no token", rep.Cmdline)
	}
	if !strings.Contains(rep.Environ, "permission denied") {
		t.Errorf("the other user reading roched's environment: %q, want permission denied", rep.Environ)
	}
	if rep.TCP != connect.CodeUnauthenticated.String() {
		t.Errorf("the other user over TCP without the token: %s, want unauthenticated", rep.TCP)
	}
}
