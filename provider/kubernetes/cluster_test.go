package kubernetes_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// installSeccomp installs Roche's seccomp profile on the node, as an operator does
// (roche kubernetes seccomp-profile), under a name of the test's own, and returns that
// name; it is removed when the test ends.
func installSeccomp(t *testing.T) string {
	t.Helper()
	b, err := kubernetes.SeccompProfile()
	if err != nil {
		t.Fatal(err)
	}
	// The test cluster's kubelet runs with --root-dir $STATE/kubelet.
	dir := filepath.Join(testcluster.StateDir(), "kubelet", "seccomp")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("roche-test-%x.json", rand.Uint64())
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	return name
}
