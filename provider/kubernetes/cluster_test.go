package kubernetes_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// The test cluster, until this package can use internal/testcluster (Kubeconfig,
// ImportTar): its kubeconfig is $KUBECONFIG or the one `make cluster` writes, and its
// node's containerd socket is in cluster.json beside it.

const clusterDir = "/var/lib/roche-cluster"

// clusterInfo is the part of cluster.json these tests read.
type clusterInfo struct {
	Kubeconfig string `json:"kubeconfig"`
	Containerd string `json:"containerd"`
}

func readCluster() (clusterInfo, error) {
	var c clusterInfo
	b, err := os.ReadFile(filepath.Join(clusterDir, "cluster.json"))
	if err != nil {
		return c, fmt.Errorf("no test cluster (%v): start it with make cluster", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("reading cluster.json: %v", err)
	}
	if k := os.Getenv("KUBECONFIG"); k != "" {
		c.Kubeconfig = k
	}
	return c, nil
}

// kubeconfig is the test cluster's kubeconfig.
func kubeconfig(t testing.TB) string {
	t.Helper()
	c, err := readCluster()
	if err != nil {
		t.Fatal(err)
	}
	return c.Kubeconfig
}

// importTar imports an image tarball into the node's containerd, where Pods find it.
func importTar(path string) error {
	c, err := readCluster()
	if err != nil {
		return err
	}
	out, err := exec.Command("ctr", "-a", c.Containerd, "-n", "k8s.io", "images", "import", path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("importing %s into the test cluster's containerd: %v: %s", path, err, out)
	}
	return nil
}

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
	dir := filepath.Join(clusterDir, "kubelet", "seccomp")
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
