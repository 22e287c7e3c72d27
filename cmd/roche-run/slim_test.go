package main

import (
	"os"
	"os/exec"
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
