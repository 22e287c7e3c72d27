package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestOneBinary: roche and roched alone, with no roche-agent beside them, no
// ROCHE_AGENT and no daemon, run Docker sandboxes: roche hands each command to roched,
// whose providers run the agent roched carries (files, the sandbox user, exit codes),
// not the slower docker-exec path that has none of those.
func TestOneBinary(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := t.TempDir()
	roche, roched, err := testenv.BuildCLI(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{roche, roched} {
		if !guestbin.Static(bin) {
			t.Fatalf("%s is not static: a sandbox's image may have no C library to run it", bin)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, guestbin.Name)); !os.IsNotExist(err) {
		t.Fatalf("a roche-agent is beside roche (%v): the test would not prove anything", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tag, untag, err := testenv.PrivateImage(ctx, "onebinary")
	if err != nil {
		t.Fatal(err)
	}
	defer untag()
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, guestbin.Env+"=") || strings.HasPrefix(kv, "ROCHE_SOCKET=")
	})
	// No daemon: roched, run as roche in this command's process, serves the sandbox.
	env = append(env, "ROCHE_SOCKET="+filepath.Join(dir, "nobody.sock"))
	run := func(stdin string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.CommandContext(ctx, roche, args...)
		cmd.Env = env
		cmd.Stdin = strings.NewReader(stdin)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Logf("roche %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out), err
	}

	out, err := run("", "create", "--json", "--image", tag)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct {
		ID        string `json:"id"`
		Transport string `json:"transport"`
	}
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" {
		t.Fatalf("roche create --json: %q: %v", out, err)
	}
	destroyed := false
	defer func() {
		if !destroyed {
			run("", "destroy", sb.ID)
		}
	}()
	if sb.Transport != "agent" {
		t.Fatalf("the sandbox runs commands through %q, want the agent roched carries", sb.Transport)
	}
	host := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(host, []byte("carried\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run("", "cp", host, sb.ID+":/tmp/in.txt"); err != nil {
		t.Fatal(err)
	}
	out, err = run("", "exec", "--sandbox", sb.ID, "--", "sh", "-c", "cat /tmp/in.txt; id -u; grep ^CapEff /proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != "carried" || lines[1] == "0" || !strings.HasSuffix(lines[2], "0000000000000000") {
		t.Fatalf("in the sandbox: %q, want the copied file, a non-root uid and no capabilities", out)
	}
	if _, err := run("", "destroy", sb.ID); err != nil {
		t.Fatal(err)
	}
	destroyed = true
}
