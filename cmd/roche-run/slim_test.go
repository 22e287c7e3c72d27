package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// heavy are what roche-run must not link, with why: each costs its start, which a
// one-shot roche run pays per call (roched's package initialisation was ~10 ms of its
// ~15 ms start; roche-run's is a fraction). roched links them.
var heavy = []struct{ prefix, why string }{
	{"github.com/roche-sandbox/roche/provider/kubernetes", "the kubernetes provider (roched's)"},
	{"github.com/roche-sandbox/roche/provider/vm", "the microVM providers (roched's)"},
	{"github.com/roche-sandbox/roche/internal/inproc", "every provider (roched's): roche-run has internal/inproc/direct"},
	{"github.com/roche-sandbox/roche/internal/cli/full", "the full CLI's in-process part"},
	{"github.com/roche-sandbox/roche/internal/daemon", "roched"},
	{"github.com/roche-sandbox/roche/internal/mcp", "the MCP server (roche mcp runs in roched)"},
	{"github.com/roche-sandbox/roche/internal/imagebuild", "roche image build (roched's)"},
	{"github.com/modelcontextprotocol/", "the MCP server"},
	{"k8s.io/", "client-go"},
	{"sigs.k8s.io/", "client-go"},
	{"github.com/firecracker-microvm/", "the firecracker provider"},
	{"github.com/go-openapi/", "the firecracker provider"},
	{"go.mongodb.org/", "the firecracker provider"},
	{"connectrpc.com/grpcreflect", "roched's gRPC reflection"},
	{"github.com/prometheus/", "roched's metrics"},
	{"go.opentelemetry.io/otel/sdk", "roched's traces"},
	{"go.opentelemetry.io/otel/exporters/", "roched's traces"},
}

// TestSlim: roche-run links the providers of a one-shot run and none of roched's heavy
// rest.
func TestSlim(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // as make build builds it
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		for _, h := range heavy {
			if (dep == h.prefix || strings.HasPrefix(dep, strings.TrimSuffix(h.prefix, "/")+"/")) &&
				dep != "github.com/roche-sandbox/roche/internal/inproc/direct" {
				t.Errorf("roche-run links %s (%s)", dep, h.why)
			}
		}
	}
	for _, want := range []string{"docker", "oci", "wasm"} {
		if !slices.Contains(deps, "github.com/roche-sandbox/roche/provider/"+want) {
			t.Errorf("roche-run does not link provider/%s: the check reads the wrong list, or a one-shot %s run would go to roched", want, want)
		}
	}
}

// TestWarmsFirst: package ociwarm, which begins a one-shot oci run's cgroup warm-up,
// initialises before the packages that take roche-run's start-up time (protobuf's
// descriptors, Docker's reference grammar), or it would begin no earlier than the
// create.
func TestWarmsFirst(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "roche-run")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building roche-run: %v\n%s", err, b)
	}
	cmd := exec.Command(bin, "--version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("roche-run --version: %v: %s", err, stderr.String())
	}
	inits := stderr.String()
	warm := strings.Index(inits, "init github.com/roche-sandbox/roche/internal/rocherun/ociwarm ")
	if warm < 0 {
		t.Fatalf("no init of package ociwarm:\n%s", inits)
	}
	for _, heavy := range []string{"init google.golang.org/protobuf/internal/filedesc ", "init github.com/distribution/reference "} {
		if i := strings.Index(inits, heavy); i >= 0 && i < warm {
			t.Errorf("%q initialises before package ociwarm:\n%s", heavy, inits)
		}
	}
}
