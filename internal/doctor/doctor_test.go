package doctor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/doctor"
	"github.com/roche-sandbox/roche/internal/inproc"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
)

// run is roche doctor's report with the providers opened in this process.
func run(t *testing.T, image string, s catalog.Options) doctor.Report {
	t.Helper()
	s.EngineTimeout, s.Transport = 30*time.Second, "agent"
	return doctor.Run(context.Background(), doctor.Options{Open: inproc.Open, Settings: s, Image: image, Timeout: 5 * time.Second})
}

// entry is the report's entry for provider name on runtime rt.
func entry(t *testing.T, r doctor.Report, name, rt string) doctor.Provider {
	t.Helper()
	for _, p := range r.Providers {
		if p.Name == name && p.Runtime == rt {
			return p
		}
	}
	t.Fatalf("no entry for %s (%q) in %+v", name, rt, r.Providers)
	return doctor.Provider{}
}

// wantMissing checks that p does not work for want, with fix as its fix.
func wantMissing(t *testing.T, p doctor.Provider, missing, detail, fix string, asRoot bool) {
	t.Helper()
	if p.OK || p.Missing != missing || !strings.Contains(p.Detail, detail) || p.Fix != fix || p.AsRoot != asRoot {
		t.Errorf("%s (%s): ok=%v missing %q (%s), fix %q as root %v; want missing %q (detail with %q), fix %q as root %v",
			p.Name, p.Runtime, p.OK, p.Missing, p.Detail, p.Fix, p.AsRoot, missing, detail, fix, asRoot)
	}
}

// TestDockerImage: with the test image, docker on runc works and the report's exit
// status (DefaultOK) says so; asked for an image that does not exist, docker, oci and
// qemu each name the image as what is missing and roche image build python, as root, as
// the fix, and the default provider does not work.
func TestDockerImage(t *testing.T) {
	testenv.Needs(t, testenv.Docker, testenv.Root)
	r := run(t, testenv.Image(), catalog.Options{})
	if p := entry(t, r, "docker", "runc"); !p.OK || !r.DefaultOK {
		t.Fatalf("docker with %s: %+v, default ok %v; want it to work", testenv.Image(), p, r.DefaultOK)
	}
	const none = "roche-doctor-test/no-such-image:0"
	r = run(t, none, catalog.Options{})
	wantMissing(t, entry(t, r, "docker", "runc"), "image", none+" is not in the Docker engine", "roche image build python", true)
	wantMissing(t, entry(t, r, "oci", "runc"), "image", none+" is not in the local Docker engine", "roche image build python", true)
	wantMissing(t, entry(t, r, "qemu", ""), "image", none+" is not in the local Docker engine", "roche image build python", true)
	if r.DefaultOK {
		t.Error("the default provider, docker, without its image: the report says it works (exit status 0)")
	}
}

// TestDockerEngineHangsOrIsGone: a Docker host that accepts and never answers is
// reported within the bound, with a restart as the fix; one where nothing listens,
// with a start. The rest of the report is not held up by it.
func TestDockerEngineHangsOrIsGone(t *testing.T) {
	dir := testenv.ShortDir(t)
	silent := testenv.SilentSocket(t, filepath.Join(dir, "hung.sock"))
	t.Setenv("DOCKER_HOST", "unix://"+silent)
	start := time.Now()
	r := doctor.Run(context.Background(), doctor.Options{Open: inproc.Open,
		Settings: catalog.Options{EngineTimeout: 30 * time.Second, Transport: "agent"}, Timeout: time.Second})
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("doctor with a hung engine took %s, want within its 1s bound and a grace", took)
	}
	wantMissing(t, entry(t, r, "docker", "runc"), "engine", "not answering", "systemctl restart docker", true)
	wantMissing(t, entry(t, r, "docker", "runsc"), "engine", "not answering", "systemctl restart docker", true)
	if r.DefaultOK {
		t.Error("a hung engine: the report says docker works")
	}

	gone := filepath.Join(dir, "gone.sock")
	t.Setenv("DOCKER_HOST", "unix://"+gone)
	r = doctor.Run(context.Background(), doctor.Options{Open: inproc.Open,
		Settings: catalog.Options{EngineTimeout: 30 * time.Second, Transport: "agent"}, Timeout: 5 * time.Second})
	wantMissing(t, entry(t, r, "docker", "runc"), "engine", "not reachable at unix://"+gone, "systemctl start docker", true)
}

// TestWasmPython: python.wasm where ROCHE_PYTHON_WASM points, present or not.
func TestWasmPython(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("ROCHE_PYTHON_WASM", filepath.Join(dir, "python.wasm"))
	r := doctor.Run(context.Background(), doctor.Options{Open: inproc.Open, Default: "wasm",
		Settings: catalog.Options{EngineTimeout: 30 * time.Second, Transport: "agent"}})
	wantMissing(t, entry(t, r, "wasm", ""), "python.wasm", "not installed at "+filepath.Join(dir, "python.wasm"), "roche image build python --provider wasm", false)
	if r.DefaultOK {
		t.Error("wasm as the default without python.wasm: the report says it works")
	}
	// The provider looks for a file there; that it runs is its own tests' business.
	if err := os.WriteFile(filepath.Join(dir, "python.wasm"), []byte("\x00asm"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = doctor.Run(context.Background(), doctor.Options{Open: inproc.Open, Default: "wasm",
		Settings: catalog.Options{EngineTimeout: 30 * time.Second, Transport: "agent"}})
	if p := entry(t, r, "wasm", ""); !p.OK || !r.DefaultOK {
		t.Errorf("wasm with python.wasm in place: %+v, default ok %v; want it to work", p, r.DefaultOK)
	}
}

// TestKubernetesCluster: no cluster configured names the kubeconfig and how to set it;
// a kubeconfig whose API server is nowhere (a closed port on loopback) names the
// cluster; the test cluster works.
func TestKubernetesCluster(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	settings := catalog.Options{EngineTimeout: 30 * time.Second, Transport: "agent"}
	r := doctor.Run(context.Background(), doctor.Options{Open: inproc.Open, Settings: settings})
	wantMissing(t, entry(t, r, "kubernetes", ""), "kubeconfig", "no Kubernetes cluster configured", "export KUBECONFIG=/path/to/kubeconfig", false)

	dir := t.TempDir()
	nowhere := filepath.Join(dir, "kubeconfig")
	// Port 1 on loopback: nothing listens there, and nothing leaves the machine.
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(nowhere, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	settings.Kubeconfig = nowhere
	r = doctor.Run(context.Background(), doctor.Options{Open: inproc.Open, Settings: settings})
	wantMissing(t, entry(t, r, "kubernetes", ""), "cluster", "API server at https://127.0.0.1:1 does not answer", "", false)
}

// TestKubernetesClusterPresent: the test cluster, reached with its kubeconfig, answers
// with its version.
func TestKubernetesClusterPresent(t *testing.T) {
	kc := testcluster.Kubeconfig(t) // brought up when it is not
	r := doctor.Run(context.Background(), doctor.Options{Open: inproc.Open,
		Settings: catalog.Options{EngineTimeout: 30 * time.Second, Transport: "agent", Kubeconfig: kc}})
	p := entry(t, r, "kubernetes", "")
	if !p.OK {
		t.Fatalf("kubernetes with the test cluster: %+v", p)
	}
	if c := p.Checks[1]; c.Check != "cluster" || !strings.HasPrefix(c.Detail, "Kubernetes v") {
		t.Errorf("the cluster check: %+v, want the server's version", c)
	}
}

// TestEveryProviderReported: every provider of the catalog has an entry, docker and oci
// one per runtime, each with its checks, and an entry that does not work names what.
func TestEveryProviderReported(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "none.sock"))
	r := doctor.Run(context.Background(), doctor.Options{Open: inproc.Open,
		Settings: catalog.Options{EngineTimeout: 30 * time.Second, Transport: "agent"}})
	want := map[string]int{"docker": 2, "oci": 2}
	got := map[string]int{}
	for _, p := range r.Providers {
		got[p.Name]++
		if len(p.Checks) == 0 || (!p.OK && p.Missing == "") {
			t.Errorf("%s (%s): %+v: want checks, and what is missing when it does not work", p.Name, p.Runtime, p)
		}
	}
	for _, name := range catalog.Names() {
		if got[name] != max(want[name], 1) {
			t.Errorf("%d entries for %s, want %d", got[name], name, max(want[name], 1))
		}
	}
	if r.Schema != doctor.Schema || len(r.Host) == 0 {
		t.Errorf("schema %d, host %+v", r.Schema, r.Host)
	}
}

// TestUnansweredDiagnosis: a provider whose checks ignore their deadline is reported as
// not answering once the bound and its grace pass, and the report does not wait for it.
func TestUnansweredDiagnosis(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	open := func(name string, _ catalog.Options) (roche.Provider, error) { return stuck{release: release}, nil }
	start := time.Now()
	r := doctor.Run(context.Background(), doctor.Options{Open: open, Default: "wasm", Timeout: 100 * time.Millisecond})
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the report waited %s for checks that never end", took)
	}
	wantMissing(t, entry(t, r, "wasm", ""), "answer", "did not finish within 100ms", "", false)
}

// stuck is a provider whose Diagnose never returns until released.
type stuck struct {
	roche.Provider // never called
	release        chan struct{}
}

func (s stuck) Diagnose(context.Context, string) []kit.Finding { <-s.release; return nil }

// TestMicroVMs: with QEMU on PATH, qemu works here (KVM, or TCG only, which the report
// says); with a PATH without it, the hypervisor is what is missing, installed from
// Debian. firecracker has no binary here, and no package to install it from.
func TestMicroVMs(t *testing.T) {
	testenv.Needs(t, testenv.Docker, testenv.QEMU, testenv.Root)
	r := run(t, testenv.Image(), catalog.Options{})
	q := entry(t, r, "qemu", "")
	if !q.OK {
		t.Fatalf("qemu with QEMU and the test image: %+v", q)
	}
	if kvm := detailOf(q, "kvm"); !strings.HasPrefix(kvm, "KVM") && !strings.HasPrefix(kvm, "TCG only") && !strings.HasPrefix(kvm, "/dev/kvm opens") {
		t.Errorf("the kvm check: %q, want KVM or TCG only", kvm)
	}
	if _, err := exec.LookPath("firecracker"); err != nil {
		wantMissing(t, entry(t, r, "firecracker", ""), "hypervisor", "no firecracker binary", "", false)
	}
	t.Setenv("PATH", t.TempDir())
	r = run(t, testenv.Image(), catalog.Options{})
	wantMissing(t, entry(t, r, "qemu", ""), "hypervisor", "qemu-system-x86_64 not found", "apt-get install qemu-system-x86", true)
}
