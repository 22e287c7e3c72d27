package escape

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/kubernetes"
	"github.com/roche-sandbox/roche/provider/oci"
	"github.com/roche-sandbox/roche/provider/vm"
	"github.com/roche-sandbox/roche/provider/wasm"
)

// A column of the table: a provider as roched opens it by default, on one runtime.
type column struct {
	name string
	// open returns the provider and the config its sandboxes are made with.
	open func(t *testing.T) (roche.Provider, roche.Config)
	// lean is set where the exhaustion attacks stop at smaller caps: every step is slow
	// (an emulated microVM), or the whole sandbox is one host process whose memory
	// limit ends it first (gVisor's sentry), or what it takes is the host's own (a WASI
	// guest's files are host files of the provider's process).
	lean bool
	// hostFiles: the sandbox's files are files of the host's filesystem, with a byte
	// quota, so a file count reached without a refusal is the host's inodes taken.
	hostFiles bool
	// ownKernel: the sandbox's system calls reach a kernel of its own (gVisor's sentry,
	// a guest's), not the host's, so its open files are not the host's.
	ownKernel bool
}

// columns are the table's columns, in its order.
var columns = []column{
	{name: "docker", open: openDocker()},
	{name: "docker+runsc", open: openDocker(docker.WithRuntime(docker.RuntimeGVisor)), lean: true, ownKernel: true},
	{name: "oci (crun)", open: openOCI(oci.RuntimeCrun)},
	{name: "oci (runc)", open: openOCI(oci.RuntimeRunc)},
	{name: "kubernetes", open: openKubernetes},
	{name: "qemu", open: openQEMU, lean: true, ownKernel: true},
	{name: "wasm", open: openWasm, lean: true, hostFiles: true},
}

func baseConfig() roche.Config {
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	cfg.TimeoutSecs = 600
	return cfg
}

// owned is whose the suite's sandboxes are, so that they can be told from others'.
var owned = kit.CreateOptions{Owner: fmt.Sprintf("escape-test:%d", os.Getpid())}

func openDocker(opts ...docker.Option) func(t *testing.T) (roche.Provider, roche.Config) {
	return func(t *testing.T) (roche.Provider, roche.Config) {
		p, err := docker.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Ping(ctx); err != nil {
			t.Fatalf("%v (make test starts dockerd and builds the image)", err)
		}
		return p, baseConfig()
	}
}

func openOCI(runtime string) func(t *testing.T) (roche.Provider, roche.Config) {
	return func(t *testing.T) (roche.Provider, roche.Config) {
		if os.Geteuid() != 0 {
			t.Fatal("the oci provider needs root (make test runs as root)")
		}
		// A state directory of the suite's own, so that nothing else reaps its sandboxes.
		state := filepath.Join("/run/roche-test", "oci-escape-"+runtime)
		if err := os.MkdirAll(state, 0o700); err != nil {
			t.Fatal(err)
		}
		p, err := oci.New(oci.WithRuntime(runtime), oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p, baseConfig()
	}
}

// The agent image, imported into the test cluster's node once per run (no registry).
var (
	agentImageOnce sync.Once
	agentImageRef  string
	agentImageErr  error
	cluster        *testcluster.Cluster
)

func importAgentImage() (string, error) {
	agentImageOnce.Do(func() {
		cluster, agentImageErr = testcluster.Up()
		if agentImageErr != nil {
			return
		}
		dir, err := os.MkdirTemp("", "roche-escape-agent-")
		if err != nil {
			agentImageErr = err
			return
		}
		defer os.RemoveAll(dir)
		tarPath := filepath.Join(dir, "agent.tar")
		f, err := os.Create(tarPath)
		if err != nil {
			agentImageErr = err
			return
		}
		agentImageRef, agentImageErr = kubernetes.WriteAgentImage(f, os.Getenv("ROCHE_AGENT"))
		f.Close()
		if agentImageErr == nil {
			agentImageErr = cluster.ImportTar(tarPath)
		}
	})
	return agentImageRef, agentImageErr
}

// removeAgentImage takes the agent image out of the node again, if it was imported.
func removeAgentImage() error {
	if cluster == nil || agentImageRef == "" {
		return nil
	}
	return cluster.RemoveImage(agentImageRef)
}

// openKubernetes: the provider as roched opens it without flags (the runtime's default
// seccomp profile, no RuntimeClass), in a namespace of the suite's own.
func openKubernetes(t *testing.T) (roche.Provider, roche.Config) {
	if _, err := importAgentImage(); err != nil {
		t.Fatalf("the test cluster (make test starts it): %v", err)
	}
	ns := fmt.Sprintf("roche-escape-%x", rand.Uint64())
	p, err := kubernetes.New(kubernetes.WithKubeconfig(testcluster.Kubeconfig(t)), kubernetes.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Available(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := deleteNamespace(ns); err != nil {
			t.Error(err)
		}
	})
	cfg := baseConfig()
	cfg.Disk = "0" // the kubelet bounds a writable root by eviction, not ENOSPC
	return p, cfg
}

func deleteNamespace(ns string) error {
	c, err := cluster.NewClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return c.DeleteNamespace(ctx, ns)
}

func openQEMU(t *testing.T) (roche.Provider, roche.Config) {
	p, err := vm.NewQEMU(vm.WithStateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Available(); err != nil {
		t.Fatalf("%v (make test installs qemu-system-x86 and a kernel)", err)
	}
	return p, baseConfig()
}

func openWasm(t *testing.T) (roche.Provider, roche.Config) {
	p, err := wasm.New(wasm.WithStateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := p.Prepare(ctx); err != nil {
		t.Fatalf("the wasm provider needs python.wasm (make test fetches it): %v", err)
	}
	cfg := roche.DefaultConfig()
	cfg.TimeoutSecs = 600
	return p, cfg
}

// hostAddrs are this host's own non-loopback addresses, from its interfaces.
func hostAddrs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/fib_trie")
	if err != nil {
		t.Fatal(err)
	}
	// "|-- ADDR" followed by "/32 host LOCAL" names a local address.
	var out []string
	lines := strings.Split(string(b), "\n")
	seen := map[string]bool{}
	for i := 1; i < len(lines); i++ {
		if strings.Contains(lines[i], "/32 host LOCAL") {
			f := strings.Fields(lines[i-1])
			if len(f) == 2 && !strings.HasPrefix(f[1], "127.") && !seen[f[1]] {
				seen[f[1]] = true
				out = append(out, f[1])
			}
		}
	}
	return out
}
