package guestbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestStaticRefusesWhatNeedsALoader: a dynamically linked program (the host's sh) and a
// file that is no executable are not offered as the agent. (A static one is: see
// cmd/roche's TestOneBinary.)
func TestStaticRefusesWhatNeedsALoader(t *testing.T) {
	if Static("/bin/sh") {
		t.Error("/bin/sh, which needs the dynamic loader, was taken for static")
	}
	script := filepath.Join(t.TempDir(), "roche-agent")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if Static(script) || Static(filepath.Join(t.TempDir(), "missing")) {
		t.Error("a script or a missing file was taken for a static executable")
	}
}

// TestPathFindsTheAgentOnPATH: a program of the user's own (go run, nothing beside it)
// finds a static roche-agent on PATH, where go install puts it; a dynamic one there is
// not taken, and ROCHE_AGENT still wins.
func TestPathFindsTheAgentOnPATH(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, Name)
	build := exec.Command("go", "build", "-o", agent, "./testdata/static")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building a static program: %v\n%s", err, out)
	}
	t.Setenv(Env, "")
	os.Unsetenv(Env)
	t.Setenv("PATH", dir)
	if got := Path(); got != agent {
		t.Fatalf("Path() = %q with a static roche-agent on PATH, want %s", got, agent)
	}
	dynamic := t.TempDir()
	sh, _ := exec.LookPath("sh")
	if sh == "" {
		sh = "/bin/sh"
	}
	b, err := os.ReadFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dynamic, Name), b, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dynamic)
	if got := Path(); got != "" {
		t.Fatalf("Path() = %q with a dynamically linked roche-agent on PATH, want none", got)
	}
	t.Setenv(Env, "/somewhere/roche-agent")
	if got := Path(); got != "/somewhere/roche-agent" {
		t.Fatalf("Path() = %q with %s set", got, Env)
	}
}

// TestPathMakesARelativeAgentAbsolute: ROCHE_AGENT=bin/roche-agent, as a user in a clone
// would write it, names the file from the current directory; the providers use the path
// from elsewhere (crun runs in its bundle directory), so Path makes it absolute.
func TestPathMakesARelativeAgentAbsolute(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	t.Setenv(Env, filepath.Join("bin", Name))
	if got, want := Path(), filepath.Join(dir, "bin", Name); got != want {
		t.Fatalf("Path() = %q for ROCHE_AGENT=bin/%s run in %s, want %s", got, Name, dir, want)
	}
	t.Setenv(Env, "")
	if got := Path(); got != "" {
		t.Fatalf("Path() = %q with ROCHE_AGENT set and empty, want none (the agent turned off)", got)
	}
}
