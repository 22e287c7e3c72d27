package ledger

import (
	"os/exec"
	"strings"
	"testing"
)

// forbidden are what the ledger must not link: the RPC stack and the generated API (the
// edge, internal/daemon, speaks them and converts through internal/wire), the command
// line, the Go client, the metrics exposition, and the backends themselves (the ledger
// works over roche.Provider, whatever serves it, and the optional interfaces of
// provider/kit, which is no backend).
var forbidden = []string{
	"connectrpc.com/",
	"google.golang.org/protobuf/",
	"google.golang.org/grpc",
	"github.com/spf13/cobra",
	"github.com/prometheus/",
	"github.com/roche-sandbox/roche/api/",
	"github.com/roche-sandbox/roche/client",
	"github.com/roche-sandbox/roche/internal/daemon",
	"github.com/roche-sandbox/roche/internal/wire",
	"github.com/roche-sandbox/roche/internal/catalog",
	"github.com/roche-sandbox/roche/provider/",
}

// forbiddenDeps lists what pkg links (go list -deps) of the forbidden.
func forbiddenDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps %s listed only %v", pkg, deps)
	}
	var bad []string
	for _, d := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) && d != "github.com/roche-sandbox/roche/provider/kit" {
				bad = append(bad, d)
			}
		}
	}
	return bad
}

// TestLedgerImportsNoEdge: the ledger links none of the forbidden packages, so the seam
// between the API edge and the state it serves stays where it is drawn.
func TestLedgerImportsNoEdge(t *testing.T) {
	if bad := forbiddenDeps(t, "."); len(bad) > 0 {
		t.Fatalf("internal/ledger links %s: move that to the edge (internal/daemon), which converts through internal/wire", strings.Join(bad, ", "))
	}
	// The check finds what is there: the edge links connect and cobra.
	edge := strings.Join(forbiddenDeps(t, "../daemon"), " ")
	for _, want := range []string{"connectrpc.com/connect", "github.com/spf13/cobra", "github.com/roche-sandbox/roche/api/roche/v1"} {
		if !strings.Contains(edge, want) {
			t.Errorf("the check does not see %s in internal/daemon's dependencies: %s", want, edge)
		}
	}
}
