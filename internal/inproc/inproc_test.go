package inproc

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/oci"
	"github.com/roche-sandbox/roche/provider/wasm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// isolate points every provider's directories into the test's own, so that opening
// one here touches nothing another process uses.
func isolate(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, v := range []string{"XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_DATA_HOME"} {
		t.Setenv(v, filepath.Join(dir, strings.ToLower(v)))
	}
	t.Setenv("ROCHE_AGENT", filepath.Join(dir, "roche-agent"))
	t.Setenv(wasm.PythonEnv, "")
	t.Setenv("ROCHE_VM_ACCEL", "")
	// A cluster configured, if not one that answers: the kubernetes provider opens.
	t.Setenv("KUBECONFIG", filepath.Join(dir, "kubeconfig"))
	return dir
}

// logBuffer is a log destination safe to read while a provider's goroutines write, and
// to wait on for a line.
type logBuffer struct{ testenv.SyncBuffer }

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// good is what the CLI opens providers with, save the logger.
func good() catalog.Options {
	return catalog.Options{EngineTimeout: docker.DefaultEngineTimeout, Transport: docker.TransportAgent}
}

func TestUnknownProviderRefusedWithTheList(t *testing.T) {
	isolate(t)
	for _, name := range []string{"vmware", "", "Docker", "vm"} {
		p, err := Open(name, good())
		if p != nil || !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "choose one of docker, firecracker, kubernetes, oci, qemu, wasm") {
			t.Errorf("Open(%q) = %v, %v; want ErrInvalidConfig listing the providers", name, p, err)
		}
	}
}

// TestEveryProviderHasAConstructor: the constructors are keyed by the provider packages'
// names, which must be the list's, one each.
func TestEveryProviderHasAConstructor(t *testing.T) {
	var keys []string
	for name := range constructors {
		keys = append(keys, name)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, catalog.Names()) {
		t.Fatalf("constructors for %v, providers %v", keys, catalog.Names())
	}
}

func TestOpenEveryProvider(t *testing.T) {
	isolate(t)
	for _, name := range catalog.Names() {
		p, err := Open(name, good())
		if err != nil {
			t.Fatalf("Open(%q): %v", name, err)
		}
		if p.Name() != name {
			t.Errorf("Open(%q) opened %q", name, p.Name())
		}
		if err := (catalog.Set{name: p}).Close(); err != nil {
			t.Errorf("closing %s: %v", name, err)
		}
	}
}

// TestDockerOptions: the Docker options reach docker.New, a bad one refused with
// ErrInvalidConfig, as the CLI's flags and roched's settings are.
func TestDockerOptions(t *testing.T) {
	isolate(t)
	bad := good()
	bad.Transport = "ssh"
	if p, err := Open("docker", bad); p != nil || !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), `transport "ssh"`) {
		t.Fatalf("Open(docker) with transport ssh = %v, %v; want ErrInvalidConfig naming it", p, err)
	}
	bad = good()
	bad.EngineTimeout = 0
	if p, err := Open("docker", bad); p != nil || !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "engine timeout 0s") {
		t.Fatalf("Open(docker) with engine timeout 0 = %v, %v; want ErrInvalidConfig naming it", p, err)
	}

	// Egress proxies need a process that outlives its sandboxes and roche-agent in them.
	for _, c := range []struct {
		outlives  bool
		transport string
		egress    bool
	}{
		{false, docker.TransportAgent, false},
		{true, docker.TransportAgent, true},
		{true, docker.TransportDockerExec, false},
	} {
		o := good()
		o.Outlives, o.Transport = c.outlives, c.transport
		p, err := Open("docker", o)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Capabilities().Egress; got != c.egress {
			t.Errorf("Outlives %v, transport %s: egress %v, want %v", c.outlives, c.transport, got, c.egress)
		}
		(catalog.Set{"docker": p}).Close()
	}
}

// TestLogAndWarmStartReachWasm: with WarmStart the wasm provider compiles python.wasm
// in the background at once, and says so, through the logger given, tagged with its
// name. The module here is not WebAssembly, so the compile fails quickly and is logged.
func TestLogAndWarmStartReachWasm(t *testing.T) {
	dir := isolate(t)
	notWasm := filepath.Join(dir, "python.wasm")
	if err := os.WriteFile(notWasm, []byte("not a module"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(wasm.PythonEnv, notWasm)
	const failed = "preparing python.wasm in the background failed"
	for _, warm := range []bool{false, true} {
		var log logBuffer
		o := good()
		o.Log, o.WarmStart = log.logger(), warm
		p, err := Open("wasm", o)
		if err != nil {
			t.Fatal(err)
		}
		if warm {
			log.Await(t, failed, nil, time.Minute)
		}
		(catalog.Set{"wasm": p}).Close()
		logged := log.String()
		if strings.Contains(logged, failed) != warm {
			t.Fatalf("WarmStart %v: log %q", warm, logged)
		}
		if warm && !strings.Contains(logged, "provider=wasm") {
			t.Fatalf("the provider's log does not name it: %q", logged)
		}
	}
}

// TestServeDegrades: roched's rules. A required provider (docker) that cannot be
// opened stops it; any other is left out with a warning; wasm without python.wasm is
// served, with a warning saying how to fetch it.
func TestServeDegrades(t *testing.T) {
	isolate(t)
	var log logBuffer
	o := good()
	o.Log = log.logger()
	set, _, err := Serve(o)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, 0, len(set))
	for n := range set {
		got = append(got, n)
	}
	slices.Sort(got)
	set.Close()
	if !slices.Equal(got, catalog.Names()) {
		t.Fatalf("Serve served %v, want every provider %v", got, catalog.Names())
	}
	if l := log.String(); !strings.Contains(l, "wasm provider unavailable") || !strings.Contains(l, wasm.FetchHint) {
		t.Fatalf("Serve did not say why wasm is unavailable: %q", l)
	}

	// A microVM that cannot be made (a bad ROCHE_VM_ACCEL) is left out, with the reason.
	t.Setenv("ROCHE_VM_ACCEL", "warp")
	log = logBuffer{}
	o.Log = log.logger()
	set, leftOut, err := Serve(o)
	if err != nil {
		t.Fatal(err)
	}
	_, qemu := set["qemu"]
	_, fc := set["firecracker"]
	_, dk := set["docker"]
	set.Close()
	if qemu || fc || !dk {
		t.Fatalf("with ROCHE_VM_ACCEL=warp Serve served qemu %v, firecracker %v, docker %v", qemu, fc, dk)
	}
	for _, name := range []string{"qemu", "firecracker"} {
		if l := log.String(); !strings.Contains(l, name+" provider unavailable: serving without it") || !strings.Contains(l, `acceleration \"warp\"`) {
			t.Fatalf("Serve did not say why %s is left out: %q", name, l)
		}
		if err := leftOut[name]; err == nil || !strings.Contains(err.Error(), `acceleration "warp"`) {
			t.Fatalf("Serve's left-out %s: %v, want the reason for roched's /healthz", name, err)
		}
	}

	// Docker with a bad setting stops roched, and nothing opened is left open.
	t.Setenv("ROCHE_VM_ACCEL", "")
	o.Transport = "ssh"
	set, _, err = Serve(o)
	if set != nil || !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), `transport "ssh"`) {
		t.Fatalf("Serve with a bad Docker transport = %v, %v; want ErrInvalidConfig", set, err)
	}
}

// TestServeUnconfigured: a provider that needs setting up and was not set up at all
// (kubernetes: no kubeconfig, no KUBECONFIG, no in-cluster credentials) is left out by
// Serve with a line in the log, so that lists over every provider answer with the
// others'; opened alone it is a NotConfiguredError, ErrUnavailable saying what sets it
// up. Asked for (--providers, or one of its flags), it stops roched. A provider's flag
// for a provider not served stops it too.
func TestServeUnconfigured(t *testing.T) {
	isolate(t)
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	const hint = "no Kubernetes cluster configured: pass --kubeconfig, set KUBECONFIG, or run inside a cluster"
	p, err := Open("kubernetes", good())
	if p != nil || !catalog.NotConfigured(err) || !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), hint) {
		t.Fatalf("Open(kubernetes) without a cluster = %v, %v; want a NotConfiguredError saying %q", p, err, hint)
	}

	var log logBuffer
	o := good()
	o.Log = log.logger()
	set, _, err := Serve(o)
	if err != nil {
		t.Fatal(err)
	}
	_, k8s := set["kubernetes"]
	_, dk := set["docker"]
	set.Close()
	if k8s || !dk {
		t.Fatalf("Serve without a cluster served kubernetes %v, docker %v; want docker alone of the two", k8s, dk)
	}
	if l := log.String(); !strings.Contains(l, "kubernetes provider not configured: serving without it") || !strings.Contains(l, hint) {
		t.Fatalf("Serve did not say it left kubernetes out: %q", l)
	}

	for _, c := range []struct {
		set  func(*catalog.Options)
		says string
	}{
		{func(o *catalog.Options) { o.RuntimeClass = "gvisor" }, "the kubernetes provider is not set up, and --runtime-class gvisor asks for it"},
		{func(o *catalog.Options) { o.Namespace = "sandboxes" }, "the kubernetes provider is not set up, and --namespace sandboxes asks for it"},
		{func(o *catalog.Options) { o.Only = []string{"docker", "kubernetes"} }, "the kubernetes provider is not set up, and --providers names it"},
		{func(o *catalog.Options) { o.Only, o.Runtime = []string{"oci"}, "runsc" }, "--runtime is the docker provider's, and roched serves only oci"},
	} {
		o := good()
		c.set(&o)
		if set, _, err := Serve(o); set != nil || err == nil || !strings.Contains(err.Error(), c.says) {
			set.Close()
			t.Errorf("Serve = %v, %v; want an error saying %q", set, err, c.says)
		}
	}
}

// TestLayoutPrefix: the ledger checks a tenant's image layouts by the prefix the oci
// provider reads them by.
func TestLayoutPrefix(t *testing.T) {
	if ledger.LayoutPrefix != oci.LayoutPrefix {
		t.Fatalf("ledger.LayoutPrefix %q, oci.LayoutPrefix %q", ledger.LayoutPrefix, oci.LayoutPrefix)
	}
}

// TestKubernetesRefusesDockerRuntime: a --runtime other than runc (runsc, gVisor) does
// not reach Pods, so the kubernetes provider is refused with it rather than opened to
// run Pods under the node's default runtime; with a RuntimeClass, or runc, it opens.
func TestKubernetesRefusesDockerRuntime(t *testing.T) {
	isolate(t)
	o := good()
	o.Runtime = "runsc"
	p, err := Open("kubernetes", o)
	if p != nil || !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "--runtime-class") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Open(kubernetes, --runtime runsc) = %v, %v; want one line naming --runtime-class", p, err)
	}
	for _, rc := range []struct{ runtime, class string }{{"runsc", "gvisor"}, {"runc", ""}} {
		o.Runtime, o.RuntimeClass = rc.runtime, rc.class
		p, err := Open("kubernetes", o)
		if err != nil {
			t.Fatalf("Open(kubernetes, --runtime %s --runtime-class %q): %v", rc.runtime, rc.class, err)
		}
		p.(interface{ Close() error }).Close()
	}
}
