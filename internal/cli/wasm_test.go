package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunWasmWithoutDocker: the zero-dependency provider works with no Docker engine.
func TestRunWasmWithoutDocker(t *testing.T) {
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
