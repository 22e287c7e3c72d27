package quickstart

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// block is a quick start: the fenced block after a "<!-- quickstart: NAME -->" line.
type block struct{ name, lang, text string }

var marker = regexp.MustCompile("(?m)^<!-- quickstart: (\\w+) -->\\n```(\\w+)\\n((?s:.*?))^```$")

func quickStarts(t *testing.T, readme string) map[string]block {
	t.Helper()
	out := map[string]block{}
	for _, m := range marker.FindAllStringSubmatch(readme, -1) {
		out[m[1]] = block{name: m[1], lang: m[2], text: m[3]}
	}
	return out
}

// copyCheckout copies the checkout's files (tracked and new, as git sees them, with
// what is changed and not committed) to dir: the quick starts write into it (bin/,
// dist/, node_modules/, data.csv), and a copy keeps the checkout as it was.
func copyCheckout(t *testing.T, root, dir string) {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("listing the checkout's files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		fi, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted and not committed
		}
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, dst); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// shell runs a quick start's commands with bash in dir, within limit, and returns their
// standard output; their process group is killed at the limit.
func shell(t *testing.T, dir string, env []string, limit time.Duration, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("ran in %s", time.Since(start).Round(time.Second))
	if ctx.Err() != nil {
		t.Fatalf("not done within %s\nstdout:\n%s\nstderr:\n%s", limit, stdout.String(), stderr.String())
	}
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestQuickStarts runs the README's quick starts as a newcomer would, in order, on a copy
// of this checkout: the command line's, Python's (in a virtualenv), TypeScript's, Go's,
// and MCP's (the client config's command started as an MCP client starts it). Nothing
// goes to the network: npm, pip and Go take what the machine has (make test fetched it),
// and the sandboxes have none. Each has a deadline, and every sandbox they made is
// gone after.
func TestQuickStarts(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := quickStarts(t, string(readme))
	for _, name := range []string{"cli", "python", "typescript", "go", "mcp"} {
		if _, ok := blocks[name]; !ok {
			t.Fatalf("the README has no %q quick start (a <!-- quickstart: %s --> line before its block)", name, name)
		}
	}
	// The Go program the README shows is the one its quick start runs.
	prog, err := os.ReadFile(filepath.Join(root, "examples", "hello", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(prog)+"```\n") {
		t.Error("the README's Go program is not examples/hello/main.go as it is")
	}

	// Running them is the rest, as root (roche image build) with what make test set up.
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.Python, testenv.Node)
	tmp := t.TempDir()
	src := filepath.Join(tmp, "roche")
	copyCheckout(t, root, src)
	venv := filepath.Join(tmp, "venv")
	if out, err := exec.Command("python3", "-m", "venv", venv).CombinedOutput(); err != nil {
		t.Fatalf("making a virtualenv (python3-venv; make test installs it): %v\n%s", err, out)
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	owner := "cli:quickstart-" + hex.EncodeToString(rnd[:])
	env := append(os.Environ(),
		"PATH="+filepath.Join(venv, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
		"VIRTUAL_ENV="+venv,
		// No roched: the first hour of a newcomer. Every sandbox made has this test's owner.
		"ROCHE_SOCKET="+filepath.Join(tmp, "no-roched.sock"), "ROCHE_OWNER="+owner,
		// What the quick starts install comes from this machine's caches, never the network.
		"npm_config_offline=true", "npm_config_audit=false", "npm_config_fund=false", "npm_config_update_notifier=false",
		"PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "GOPROXY=off",
	)
	// The Go quick start finds the agent itself.
	env = withoutVar(env, "ROCHE_AGENT")
	t.Cleanup(func() {
		// Whatever a failed quick start left: this test's own sandboxes only.
		gc := exec.Command(filepath.Join(src, "bin", "roche"), "--direct", "gc", "--all")
		gc.Env = env
		out, err := gc.CombinedOutput()
		list := exec.Command(filepath.Join(src, "bin", "roche"), "--direct", "list", "--json")
		list.Env = env
		left, lerr := list.Output()
		if lerr != nil || strings.TrimSpace(string(left)) != "[]" {
			t.Errorf("sandboxes left by the quick starts: %s %v (gc: %v %s)", left, lerr, err, out)
		}
	})

	t.Run("cli", func(t *testing.T) {
		out := shell(t, src, env, 20*time.Minute, blocks["cli"].text)
		for _, want := range []string{"hello\n", "3.11", "\n4\n"} {
			if !strings.Contains("\n"+out, want) {
				t.Errorf("the CLI quick start printed %q, want %q in it", out, want)
			}
		}
	})
	t.Run("python", func(t *testing.T) {
		if out := shell(t, src, env, 15*time.Minute, blocks["python"].text); !strings.HasSuffix(out, "1\n\n") {
			t.Errorf("the Python quick start printed %q, want 1", out)
		}
	})
	t.Run("typescript", func(t *testing.T) {
		if out := shell(t, src, env, 10*time.Minute, blocks["typescript"].text); !strings.HasSuffix(out, "1\n\n") {
			t.Errorf("the TypeScript quick start printed %q, want 1", out)
		}
	})
	t.Run("go", func(t *testing.T) {
		if out := shell(t, src, env, 10*time.Minute, blocks["go"].text); !strings.HasSuffix(out, "\nhello\n") {
			t.Errorf("the Go quick start printed %q, want hello", out)
		}
	})
	t.Run("mcp", func(t *testing.T) {
		var cfg struct {
			MCPServers map[string]struct {
				Command string   `json:"command"`
				Args    []string `json:"args"`
			} `json:"mcpServers"`
		}
		if err := json.Unmarshal([]byte(blocks["mcp"].text), &cfg); err != nil {
			t.Fatalf("the MCP quick start's config: %v", err)
		}
		server, ok := cfg.MCPServers["roche"]
		if !ok {
			t.Fatalf("the MCP config has no roche server: %+v", cfg)
		}
		// As a client starts it: the command on PATH (bin/, after make build).
		mcpEnv := withoutVar(env, "PATH")
		mcpEnv = append(mcpEnv, "PATH="+filepath.Join(src, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
		path, err := lookPath(server.Command, filepath.Join(src, "bin"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(path, server.Args...)
		cmd.Env, cmd.Dir = mcpEnv, tmp
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "quickstart", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("starting %s %v as an MCP client does: %v", server.Command, server.Args, err)
		}
		defer cs.Close()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "print(6 * 7)"}})
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text.WriteString(tc.Text)
			}
		}
		if res.IsError || !strings.Contains(text.String(), "42") {
			t.Fatalf("run_code through the MCP quick start's server: error %v, %q", res.IsError, text.String())
		}
	})
}

func withoutVar(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// lookPath finds command as a client's PATH lookup would, first in dir.
func lookPath(command, dir string) (string, error) {
	if p := filepath.Join(dir, command); isExec(p) {
		return p, nil
	}
	p, err := exec.LookPath(command)
	if err != nil {
		return "", fmt.Errorf("%s is not on PATH: %w", command, err)
	}
	return p, nil
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
