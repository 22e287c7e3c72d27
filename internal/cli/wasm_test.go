package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestRunWasmWithoutDocker: the zero-dependency provider works with no Docker engine.
func TestRunWasmWithoutDocker(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-docker.sock"))
	r := run(t, "run", "--provider", "wasm", "--", "python3", "-c", "print('hello')")
	if r.code != 0 || r.stdout != "hello\n" {
		t.Fatalf("roche run --provider wasm: %+v", r)
	}
	// list still works, showing what the reachable providers have.
	if r := run(t, "list"); r.code != 0 {
		t.Fatalf("list without Docker: %+v", r)
	}
}

// TestMainJobWithoutDocker runs the README's main-job command (make hello) on a machine
// where docker is absent: a docker command that is not there and no engine to reach.
func TestMainJobWithoutDocker(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	if testing.Short() {
		t.Skip("builds roche from scratch")
	}
	fake := t.TempDir()
	if err := os.WriteFile(filepath.Join(fake, "docker"), []byte("#!/bin/sh\necho 'docker: command not found' >&2\nexit 127\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-s", "hello")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(),
		"PATH="+fake+string(os.PathListSeparator)+os.Getenv("PATH"),
		"DOCKER_HOST=unix://"+filepath.Join(fake, "no-docker.sock"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("make hello: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	if stdout.String() != "hello\n" || !strings.Contains(stderr.String(), "provider: wasm") {
		t.Fatalf("make hello without Docker printed %q (stderr %q), want hello from the wasm provider", stdout.String(), stderr.String())
	}
}

// TestWasmCodeState: on wasm, roche code keeps a context's variables between calls
// through roched (which holds the interpreter), and without roched, where each roche
// command is a process of its own that cannot reach the last one's interpreter, says
// so: the second call's cell runs in a fresh interpreter, restarted (--json), and a
// note on stderr says why; a context made by an earlier command is "not found", saying
// why. roche code --help says the same.
func TestWasmCodeState(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	if r := run(t, "code", "--help"); !strings.Contains(r.stdout, "without roched each roche code is a process of its own") {
		t.Errorf("roche code --help does not say what wasm keeps: %q", r.stdout)
	}
	t.Run("direct", func(t *testing.T) {
		r := run(t, "--direct", "create", "--provider", "wasm")
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create: %+v", r)
		}
		defer run(t, "--direct", "destroy", id)
		if r := run(t, "--direct", "code", "--sandbox", id, "--json", "x = 41"); r.code != 0 || strings.Contains(r.stdout, `"restarted"`) {
			t.Fatalf("the first cell: %+v", r)
		}
		r = run(t, "--direct", "code", "--sandbox", id, "x + 1")
		if r.code != 1 || !strings.Contains(r.stderr, "NameError") || !strings.Contains(r.stderr, "each roche command is a process of its own") {
			t.Fatalf("the second call without roched: %+v, want a NameError and the note saying why", r)
		}
		r = run(t, "--direct", "code", "--sandbox", id, "--json", "y = 1")
		var ex struct {
			Restarted      bool `json:"restarted"`
			ExecutionCount int  `json:"execution_count"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &ex); err != nil || !ex.Restarted || ex.ExecutionCount != 1 {
			t.Fatalf("a later call's execution: %+v (%v), want restarted and a count of 1", r, err)
		}
		r = run(t, "--direct", "context", "create", "--sandbox", id)
		ctxID := strings.TrimSpace(r.stdout)
		if r.code != 0 || ctxID == "" {
			t.Fatalf("context create: %+v", r)
		}
		r = run(t, "--direct", "code", "--sandbox", id, "--context", ctxID, "1")
		if r.code == 0 || !strings.Contains(r.stderr, "lived in another process") || !strings.Contains(r.stderr, "roched") {
			t.Fatalf("a context made by an earlier command: %+v, want not found saying why", r)
		}
	})
	t.Run("roched", func(t *testing.T) {
		wp, err := testLocal.Open("wasm", catalog.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer catalog.Set{"wasm": wp}.Close()
		socket := filepath.Join(testenv.ShortDir(t), "roched.sock")
		d, err := daemon.New(daemon.Config{Socket: socket}, map[string]roche.Provider{"wasm": wp})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := d.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer d.Shutdown(ctx)
		r := run(t, "--socket", socket, "create", "--provider", "wasm")
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create through roched: %+v", r)
		}
		defer run(t, "--socket", socket, "destroy", id)
		if r := run(t, "--socket", socket, "code", "--sandbox", id, "x = 41"); r.code != 0 {
			t.Fatalf("x = 41: %+v", r)
		}
		if r := run(t, "--socket", socket, "code", "--sandbox", id, "x + 1"); r.code != 0 || r.stdout != "42\n" || r.stderr != "" {
			t.Fatalf("x + 1 through roched: %+v, want 42: roched keeps the context", r)
		}
	})
}
