package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// mcpCall calls a tool and decodes its structured result into out.
func mcpCall(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s: %v", name, res.Content)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %s: %v", name, b, err)
	}
}

// mcpSession runs `roche mcp` (this test binary as the CLI) and connects the go-sdk's
// client to it over stdio, as an MCP client's config would.
func mcpSession(t *testing.T, socket string) (*sdk.ClientSession, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "mcp", "--image", testImage())
	cmd.Env = append(os.Environ(), "ROCHE_TEST_AS_CLI=1", "ROCHE_SOCKET="+socket)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &sdk.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connecting to roche mcp: %v\n%s", err, stderr.String())
	}
	return cs, cmd, &stderr
}

// TestMCPStdio: the real command over stdio, without a daemon; when the client goes
// away the sandboxes the server made are destroyed.
func TestMCPStdio(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	before := managed(t)
	cs, cmd, stderr := mcpSession(t, filepath.Join(t.TempDir(), "no-daemon.sock"))
	var sb struct{ ID, Image string }
	mcpCall(t, cs, "create_sandbox", nil, &sb)
	if sb.Image != testImage() {
		t.Fatalf("create_sandbox: %+v, want the --image default", sb)
	}
	var wrote struct{ Bytes int }
	mcpCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/q.py", "content": "print(sum(range(10)))"}, &wrote)
	var out struct {
		Stdout   string
		ExitCode int `json:"exit_code"`
	}
	mcpCall(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"python3", "/tmp/q.py"}}, &out)
	if out.Stdout != "45\n" || out.ExitCode != 0 {
		t.Fatalf("exec: %+v", out)
	}
	mcpCall(t, cs, "create_sandbox", nil, &sb) // left for the server to clean up
	if got := managed(t); got != before+2 {
		t.Fatalf("%d sandboxes, want %d", got, before+2)
	}
	if err := cs.Close(); err != nil {
		t.Fatalf("closing the session: %v\n%s", err, stderr.String())
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Fatalf("roche mcp did not exit cleanly when the client hung up: %v\n%s", cmd.ProcessState, stderr.String())
	}
	if got := managed(t); got != before {
		t.Fatalf("%d sandboxes left after the client hung up, want %d", got, before)
	}
}

// TestMCPThroughDaemon: with roched answering, `roche mcp` uses it (creates come from
// its warm pool), as every roche command does.
func TestMCPThroughDaemon(t *testing.T) {
	socket, c := startInProcessDaemon(t)
	hits := poolHits(t, c)
	cs, _, stderr := mcpSession(t, socket)
	defer cs.Close()
	var sb struct{ ID string }
	mcpCall(t, cs, "create_sandbox", nil, &sb)
	if poolHits(t, c) != hits+1 {
		t.Fatalf("create_sandbox was not served by roched's pool\n%s", stderr.String())
	}
	var out struct{ Stdout string }
	mcpCall(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"echo", "pooled"}}, &out)
	if out.Stdout != "pooled\n" {
		t.Fatalf("exec: %+v", out)
	}
	var gone struct{ Destroyed string }
	mcpCall(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": sb.ID}, &gone)
}

// TestMCPHTTP: `roche mcp --http` serves streamable HTTP until SIGTERM, then destroys
// what it made; it refuses what the user did (a non-loopback address, a
// 5-character token on the command line) and a token file others can read, each in one
// line naming the safe way.
func TestMCPHTTP(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := t.TempDir()
	short, open, good := filepath.Join(dir, "short"), filepath.Join(dir, "open"), filepath.Join(dir, "good")
	os.WriteFile(short, []byte("short\n"), 0o600)
	os.WriteFile(open, []byte(strings.Repeat("k", 32)), 0o644)
	os.WriteFile(good, []byte(strings.Repeat("k", 32)+"\n"), 0o600)
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--http", "0.0.0.0:8765", "--token", "short"}, "", "visible to every user"},
		{[]string{"--http", "0.0.0.0:8765", "--token-file", good}, "", "plain HTTP"},
		{[]string{"--http", "0.0.0.0:0"}, "", "ssh -L"},
		{[]string{"--http", "127.0.0.1:0", "--token-file", short}, "", "at least 16"},
		{[]string{"--http", "127.0.0.1:0", "--token-file", open}, "", "chmod 600"},
		{[]string{"--http", "127.0.0.1:0"}, "short", "at least 16"},
	} {
		t.Setenv("ROCHE_MCP_TOKEN", c.env)
		r := run(t, append([]string{"mcp"}, c.args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("roche mcp %v (ROCHE_MCP_TOKEN=%q): exit %d, %q; want one line saying %q", c.args, c.env, r.code, r.stderr, c.want)
		}
	}
	t.Setenv("ROCHE_MCP_TOKEN", "")
	before := managed(t)
	cmd := exec.Command(os.Args[0], "mcp", "--http", "127.0.0.1:0", "--token-file", good, "--image", testImage())
	cmd.Env = append(os.Environ(), "ROCHE_TEST_AS_CLI=1", "ROCHE_SOCKET="+filepath.Join(t.TempDir(), "none.sock"))
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(pipe)
	url := ""
	for url == "" && lines.Scan() {
		if _, u, ok := strings.Cut(lines.Text(), "serving streamable HTTP on "); ok {
			url = u
		}
	}
	if url == "" {
		t.Fatal("roche mcp --http did not say where it listens")
	}
	go func() {
		for lines.Scan() {
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &sdk.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true}, nil); err == nil {
		t.Fatal("a client without the token connected")
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &sdk.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true,
			HTTPClient: &http.Client{Transport: bearerToken(strings.Repeat("k", 32))}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct{ ID string }
	mcpCall(t, cs, "create_sandbox", nil, &sb)
	var out struct{ Stdout string }
	mcpCall(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"echo", "over http"}}, &out)
	if out.Stdout != "over http\n" {
		t.Fatalf("exec: %+v", out)
	}
	cs.Close()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("roche mcp --http after SIGTERM: %v", err)
	}
	if got := managed(t); got != before {
		t.Fatalf("%d sandboxes left after roche mcp stopped, want %d", got, before)
	}
}

// bearerToken sends its token with every request.
type bearerToken string

func (b bearerToken) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

func TestMCPHelp(t *testing.T) {
	r := run(t, "mcp", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "Examples:") || !strings.Contains(r.stdout, "--allow-network") {
		t.Fatalf("roche mcp --help: exit %d\n%s", r.code, r.stdout)
	}
}
