// Package testcluster gives tests the project's test Kubernetes cluster (CONTRIBUTING.md, "The
// test cluster"): a real single-node Kubernetes started by scripts/k8s/cluster.sh on this
// machine. Kubeconfig and Start bring it up when it is not running (the script is
// idempotent and serialises concurrent starts), ImportDocker and ImportTar put images into
// the node without a registry, and Client speaks to the API server with the standard
// library, so packages without client-go can use it too.
//
// The cluster is shared by every test and is left running; a test makes its own namespace
// (Client.Namespace) and deletes what it made.
package testcluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// Cluster describes the running test cluster, as scripts/k8s/cluster.sh records it in
// cluster.json beside the kubeconfig.
type Cluster struct {
	// Server is the API server's URL, https://NODE_IP:6443.
	Server string `json:"server"`
	// CAFile is the CA that signed the API server's certificate.
	CAFile string `json:"caFile"`
	// TokenFile holds the admin's bearer token (group system:masters).
	TokenFile string `json:"tokenFile"`
	// Kubeconfig is the admin kubeconfig, the path `make cluster` prints.
	Kubeconfig string `json:"kubeconfig"`
	// Node is the name of the one real node.
	Node string `json:"node"`
	// NodeIP is the node's address (an address of this host).
	NodeIP string `json:"nodeIP"`
	// Containerd is the socket of the node's containerd.
	Containerd string `json:"containerd"`
	// PodSubnet is the range Pods with network get their address from.
	PodSubnet string `json:"podSubnet"`
}

// StateDir is where cluster.sh keeps the cluster; ROCHE_CLUSTER_DIR moves it, as it moves
// the script's.
func StateDir() string {
	if d := os.Getenv("ROCHE_CLUSTER_DIR"); d != "" {
		return d
	}
	return "/var/lib/roche-cluster"
}

var (
	upOnce sync.Mutex
	upDone bool
)

// Start brings the test cluster up when it is not (on a machine without the cached
// binaries the first start builds them: 10-25 minutes) and returns its description. It
// fails the test with the script's output when the cluster cannot start (the fast tier
// skips it: testenv.Needs).
func Start(t testing.TB) *Cluster {
	t.Helper()
	testenv.Needs(t, testenv.Cluster)
	c, err := Up()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Up is Start for code without a testing.TB (a TestMain, a benchmark).
func Up() (*Cluster, error) {
	upOnce.Lock()
	defer upOnce.Unlock()
	if !upDone {
		out, err := script("up")
		if err != nil {
			return nil, fmt.Errorf("starting the test cluster (scripts/k8s/cluster.sh up): %v\n%s", err, out)
		}
		upDone = true
	}
	return load()
}

// Kubeconfig brings the test cluster up when it is not and returns the path of its admin
// kubeconfig.
func Kubeconfig(t testing.TB) string {
	t.Helper()
	return Start(t).Kubeconfig
}

// ImportDocker copies a local Docker image into the node's containerd, where Pods find it
// without a registry (name it with imagePullPolicy IfNotPresent or Never, or a tag other
// than latest).
func ImportDocker(t testing.TB, image string) {
	t.Helper()
	Start(t)
	if out, err := script("import-docker", image); err != nil {
		t.Fatalf("importing Docker image %s into the test cluster: %v\n%s", image, err, out)
	}
}

// ImportTar imports an image archive (docker save or OCI layout tar) into the node's
// containerd.
func ImportTar(t testing.TB, path string) {
	t.Helper()
	if err := Start(t).ImportTar(path); err != nil {
		t.Fatal(err)
	}
}

// ImportTar is the package's ImportTar for code without a testing.TB (benchmarks).
func (c *Cluster) ImportTar(path string) error {
	if out, err := script("import-tar", path); err != nil {
		return fmt.Errorf("importing image archive %s into the test cluster: %v\n%s", path, err, out)
	}
	return nil
}

// HasImage says whether the node's containerd has an image (a Docker-style name), so
// that a test removes only what it imported itself (make cluster imports the agent image
// of bin/roche-agent, which a test's own build of the same sources matches).
func (c *Cluster) HasImage(image string) bool {
	_, err := script("has-image", image)
	return err == nil
}

// RemoveImage removes an image (a Docker-style name such as roche/python:tag) from the
// node's containerd, for tests that imported one of their own.
func RemoveImage(t testing.TB, image string) {
	t.Helper()
	if err := Start(t).RemoveImage(image); err != nil {
		t.Error(err)
	}
}

// RemoveImage is the package's RemoveImage for code without a testing.TB (benchmarks).
func (c *Cluster) RemoveImage(image string) error {
	// containerd keeps Docker Hub names fully qualified, as imports record them.
	ref := image
	first, _, found := strings.Cut(ref, "/")
	switch {
	case !found:
		ref = "docker.io/library/" + ref
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		ref = "docker.io/" + ref
	}
	out, err := exec.Command("ctr", "-a", c.Containerd, "-n", "k8s.io", "images", "rm", ref).CombinedOutput()
	if err != nil {
		return fmt.Errorf("removing image %s from the test cluster: %v\n%s", ref, err, out)
	}
	return nil
}

func load() (*Cluster, error) {
	path := filepath.Join(StateDir(), "cluster.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the test cluster's description: %w (is it up? make cluster)", err)
	}
	var c Cluster
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	return &c, nil
}

// script runs scripts/k8s/cluster.sh with args and returns its combined output.
func script(args ...string) ([]byte, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("bash", append([]string{filepath.Join(root, "scripts", "k8s", "cluster.sh")}, args...)...)
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err = cmd.Run()
	return out.Bytes(), err
}

// repoRoot finds the module root from the working directory, which go test sets to the
// package under test.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/roche-sandbox/roche\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no github.com/roche-sandbox/roche go.mod above the working directory: run the test from the repository")
		}
		dir = parent
	}
}

// RuntimeClassGVisor is the test cluster's RuntimeClass for gVisor: its handler, runsc,
// is gVisor's containerd shim with runsc (cluster.sh).
const RuntimeClassGVisor = "gvisor"

// ContainerRuntime is the containerd runtime a container of the node runs under (such as
// io.containerd.runc.v2, or io.containerd.runsc.v1 for gVisor), by the id a Pod's
// container status gives (containerd://ID, or ID).
func (c *Cluster) ContainerRuntime(containerID string) (string, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := exec.Command("ctr", "-a", c.Containerd, "-n", "k8s.io", "containers", "info", id).Output()
	if err != nil {
		return "", fmt.Errorf("ctr containers info %s: %v", id, err)
	}
	var info struct {
		Runtime struct{ Name string }
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("decoding ctr containers info %s: %v", id, err)
	}
	return info.Runtime.Name, nil
}

// ContainerPID is the host pid of a running container's first process (its task's), by
// the id a Pod's container status gives (containerd://ID, or ID), so that a test can kill
// it as a crash would.
func (c *Cluster) ContainerPID(containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := exec.Command("ctr", "-a", c.Containerd, "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return 0, fmt.Errorf("ctr tasks ls: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == id && f[2] == "RUNNING" {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("container %s has no running task on the node", id)
}
