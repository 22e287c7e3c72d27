package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// forbidden are what roche must not link, with why: each costs every command its
// package initialisation (client-go's scheme and API groups alone some 6 ms), and the
// SDKs' CLI transport starts roche per call. roched links them and runs as the full
// roche when roche hands it a command.
var forbidden = []struct{ prefix, why string }{
	{"github.com/roche-sandbox/roche/provider/", "a provider"},
	{"github.com/roche-sandbox/roche/internal/inproc", "opens the providers"},
	{"github.com/roche-sandbox/roche/internal/cli/full", "the full CLI's in-process part"},
	{"github.com/roche-sandbox/roche/internal/daemon", "roched"},
	{"github.com/roche-sandbox/roche/internal/mcp", "the MCP server (roche mcp runs in roched)"},
	{"github.com/modelcontextprotocol/", "the MCP server"},
	{"k8s.io/", "the kubernetes provider"},
	{"sigs.k8s.io/", "the kubernetes provider"},
	{"github.com/docker/", "the Docker provider"},
	{"github.com/distribution/", "the Docker provider"},
	{"github.com/firecracker-microvm/", "the firecracker provider"},
	{"github.com/go-openapi/", "the firecracker provider"},
	{"go.mongodb.org/", "the firecracker provider"},
	{"github.com/tetratelabs/wazero", "the wasm provider"},
	{"github.com/google/go-containerregistry", "the kubernetes provider's images"},
	{"github.com/opencontainers/", "the oci provider"},
	{"github.com/prometheus/", "roched's metrics"},
	{"go.opentelemetry.io/otel/sdk", "roched's traces"},
	{"go.opentelemetry.io/otel/exporters/", "roched's traces"},
	{"go.opentelemetry.io/proto/", "roched's traces"},
}

// kit is under provider/ but is no provider: the interfaces and helpers providers share,
// over package roche and the standard library only. roched's client uses it.
const kit = "github.com/roche-sandbox/roche/provider/kit"

// allowed are the only modules besides this one and the standard library that roche
// links: the command line, roched's client and the agent it carries. A new one belongs
// here only if it initialises in next to no time (GODEBUG=inittrace=1 roche --help).
// OpenTelemetry's API (trace, propagation, attribute; xxhash under attribute) is the Go
// client's traceparent (client/trace.go): its packages' init took 0.06 ms together
// (GODEBUG=inittrace=1 roche --help); its SDK and exporters stay in roched.
var allowed = []string{
	"connectrpc.com/connect",
	"github.com/cespare/xxhash/v2",
	"github.com/hashicorp/yamux",
	"github.com/spf13/cobra",
	"github.com/spf13/pflag",
	"golang.org/x/sys",
	"golang.org/x/term",
	"go.opentelemetry.io/otel",
	"google.golang.org/protobuf",
}

// TestThin: roche links no provider, and nothing else that is slow to initialise.
func TestThin(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as make build builds it
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f.prefix) && dep != kit {
				t.Errorf("roche links %s (%s): reach it through cli.Local, which roched gives the full CLI", dep, f.why)
			}
		}
		own := strings.HasPrefix(dep, "github.com/roche-sandbox/roche")
		if !own && !slices.ContainsFunc(allowed, func(m string) bool { return dep == m || strings.HasPrefix(dep, m+"/") }) {
			t.Errorf("roche links %s, which is not among the modules it may: is it light? (see allowed)", dep)
		}
	}
}

// TestWithoutRoched: roche alone answers what needs no provider, and a command that
// needs one in this process says in one line what is missing, rather than running
// another roche (or itself) in its place.
func TestWithoutRoched(t *testing.T) {
	dir := t.TempDir()
	roche := buildRoche(t, dir)
	// Nothing on PATH, no roched beside it, no daemon.
	env := []string{"PATH=" + filepath.Join(dir, "empty"), "HOME=" + dir, "ROCHE_SOCKET=" + filepath.Join(dir, "nobody.sock")}
	run := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(roche, args...)
		cmd.Env = env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), code
	}
	if out, _, code := run("--help"); code != 0 || !strings.Contains(out, "Providers (--provider") {
		t.Fatalf("roche --help alone: exit %d, %q", code, out)
	}
	if _, errOut, code := run("daemon", "status"); code != 1 || !strings.Contains(errOut, "roched is not running") {
		t.Fatalf("roche daemon status alone: exit %d, %q", code, errOut)
	}
	const want = "roche: this needs roched, the full binary, next to roche or on PATH"
	for _, args := range [][]string{
		{"list"},
		{"exec", "--sandbox", "0123456789ab", "--", "true"},
		{"--direct", "destroy", "--all"},
		{"kubernetes", "seccomp-profile", "--output", filepath.Join(dir, "profile.json")},
		{"mcp"},
	} {
		out, errOut, code := run(args...)
		if code == 0 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, want) {
			t.Errorf("roche %s alone: exit %d, stdout %q, stderr %q; want one line %q...", strings.Join(args, " "), code, out, errOut, want)
		}
	}
	// A roched that is roche itself is not taken for the full binary.
	if err := os.Symlink(roche, filepath.Join(dir, "roched")); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := run("list"); code == 0 || !strings.HasPrefix(errOut, want) {
		t.Errorf("roche list beside a roched that is roche: exit %d, %q", code, errOut)
	}
}

// TestEarlyHandOff: a one-shot roche run on one of roche-run's providers, with no
// roched, goes to the roche-run beside roche as roche initialises (package
// rocherun/early), before protobuf's descriptors and the command line are: roche
// replaces itself with it, with the same arguments. The roche-run here is a stand-in
// that says how it was started. Anything else (roche --version) initialises all of
// roche, early's check first.
func TestEarlyHandOff(t *testing.T) {
	dir := t.TempDir()
	roche := buildRoche(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "roche-run"), []byte("#!/bin/sh\necho \"roche-run: $*\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "ROCHE_SOCKET=" + filepath.Join(dir, "nobody.sock"), "GODEBUG=inittrace=1"}
	run := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(roche, args...)
		cmd.Env = env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("roche %v: %v: %s", args, err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	// The heavy ones: protobuf's descriptors, the API's, the command line.
	const early = "init github.com/roche-sandbox/roche/internal/rocherun/early "
	heavy := []string{"init google.golang.org/protobuf/internal/filedesc ", "init google.golang.org/protobuf/internal/impl ",
		"init github.com/roche-sandbox/roche/api/roche/v1 ", "init github.com/roche-sandbox/roche/internal/cli "}

	out, inits := run("run", "--provider", "oci", "--image", "x", "--", "true")
	if want := "roche-run: run --provider oci --image x -- true\n"; out != want {
		t.Fatalf("roche run --provider oci with no roched: printed %q, want roche-run's %q", out, want)
	}
	// (early's own line never comes: it replaced roche before its init returned.)
	for _, h := range heavy {
		if strings.Contains(inits, h) {
			t.Errorf("roche handed the run over after %q:\n%s", h, inits)
		}
	}

	out, inits = run("--version")
	if !strings.HasPrefix(out, "roche ") {
		t.Fatalf("roche --version: %q", out)
	}
	e := strings.Index(inits, early)
	for _, h := range heavy {
		if i := strings.Index(inits, h); e < 0 || i < 0 || i < e {
			t.Errorf("package early initialises at %d, %q at %d: early must come first (its imports are all Go initialises early):\n%s", e, h, i, inits)
		}
	}
}

// buildRoche builds roche into dir as make build builds it, sharing the compiled
// packages of the agent's and the CLI's builds in other tests (a build of its own made
// the fast tier compile them again), and returns its path.
func buildRoche(t *testing.T, dir string) string {
	t.Helper()
	roche := filepath.Join(dir, "roche")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", roche, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building roche: %v\n%s", err, b)
	}
	return roche
}
