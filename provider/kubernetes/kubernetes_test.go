package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/kubernetes"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestMain builds roche-agent, makes the agent image from it and imports it into the
// test cluster's node (there is no registry), and removes it at the end.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	cleanup, err := testenv.SetupAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	dir, err := os.MkdirTemp("", "roche-agent-image-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	tarPath := filepath.Join(dir, "agent.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ref, err := kubernetes.WriteAgentImage(f, os.Getenv("ROCHE_AGENT"))
	f.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if testenv.Fast() {
		return m.Run() // no cluster: the tests on it skip (testcluster.Start)
	}
	cluster, err := testcluster.Up()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// make cluster imports the agent image of bin/roche-agent, which this build of the
	// same sources may match: then it stays, for what runs on the cluster after the tests.
	had := cluster.HasImage(ref)
	if err := cluster.ImportTar(tarPath); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if had {
			return
		}
		if err := cluster.RemoveImage(ref); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	return m.Run()
}

// clientset is an admin client of the test cluster, for checks from outside.
func clientset(t testing.TB) k8s.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", testcluster.Kubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// newProvider returns a provider whose sandboxes live in a namespace of the test's own,
// which the provider makes and the test deletes (and waits for) at its end.
func newProvider(t *testing.T, opts ...kubernetes.Option) *kubernetes.Provider {
	t.Helper()
	ns := fmt.Sprintf("roche-test-%x", rand.Uint64())
	p, err := kubernetes.New(append([]kubernetes.Option{kubernetes.WithKubeconfig(testcluster.Kubeconfig(t)), kubernetes.WithNamespace(ns)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Available(); err != nil {
		t.Fatal(err)
	}
	cs := clientset(t)
	t.Cleanup(func() { deleteNamespace(t, cs, ns) })
	return p
}

func deleteNamespace(t testing.TB, cs k8s.Interface, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("deleting namespace %s: %v", ns, err)
		return
	}
	for {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if ctx.Err() != nil {
			t.Errorf("namespace %s still there 2 minutes after its deletion", ns)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func baseConfig() roche.Config {
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	return cfg
}

func TestConformance(t *testing.T) {
	// At the same time as TestConformanceGVisor, after the package's other tests: both
	// mostly wait on the cluster (a Pod's start, the kubelet), so together they take
	// little longer than one.
	t.Parallel()
	// With the default seccomp profile, Roche's, which the test cluster installs on its
	// node as an operator does: the runtime's default (containerd 1.6's) allows io_uring
	// and ptrace, which the suite checks are refused.
	// With the egress proxy, as roched runs it: the suite checks the allowlist from inside.
	p := newProvider(t, kubernetes.WithEgressProxy())
	cfg := baseConfig()
	// A writable root has no ENOSPC bound on Kubernetes (the kubelet evicts instead),
	// so the writable checks run without one and the disk check expects the refusal.
	cfg.Disk = "0"
	providertest.Run(t, p, providertest.Options{
		Config:      cfg,
		NoDiskLimit: "the kubelet enforces ephemeral-storage limits by eviction",
		PidsExact:   true,
		// The kubelet mounts an emptyDir's tmpfs with neither, and a Pod cannot ask.
		ScratchMountsLackNosuid: "the kubelet mounts memory emptyDirs without nosuid and nodev",
		HostPIDs:                podPIDs(clientset(t), p.Namespace()),
	})
}

// TestConformanceGVisor runs the suite on gVisor Pods (the test cluster's RuntimeClass
// gvisor, handler runsc), as TestConformance on runc: the privilege checks assert what
// gVisor's kernel enforces, /tmp and /dev/shm are tmpfs of gVisor's kernel sized by its
// mount hints (gvisor.go), and a program past the memory limit ends the whole sandbox,
// its exec failing with the sandbox's end (OOM) as on Docker's runsc.
func TestConformanceGVisor(t *testing.T) {
	t.Parallel() // with TestConformance
	p := newProvider(t, kubernetes.WithEgressProxy(), kubernetes.WithRuntimeClass(testcluster.RuntimeClassGVisor))
	cfg := baseConfig()
	cfg.Disk = "0"
	providertest.Run(t, p, providertest.Options{
		Config:                  cfg,
		GVisor:                  true,
		NoDiskLimit:             "the kubelet enforces ephemeral-storage limits by eviction",
		PidsExact:               true,
		ScratchMountsLackNosuid: "gVisor refuses a container's mount without nosuid of a shared tmpfs that has it, and the kubelet's mount of the volume has neither",
		HostPIDs:                podPIDs(clientset(t), p.Namespace()),
	})
}

func create(t *testing.T, p *kubernetes.Provider, cfg roche.Config) roche.SandboxInfo {
	t.Helper()
	return createFor(t, p, cfg, kit.CreateOptions{})
}

// createFor is create with options (an owner, a lease), as roched creates.
func createFor(t *testing.T, p *kubernetes.Provider, cfg roche.Config, opts kit.CreateOptions) roche.SandboxInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	info, err := p.CreateFor(ctx, cfg, opts)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(context.Background(), info.ID); err != nil {
			t.Errorf("Destroy %s: %v", info.ID, err)
		}
	})
	return info
}

// execOK runs cmd in sandbox id and returns its trimmed output, failing on an error or
// a non-zero exit.
func execOK(t *testing.T, p *kubernetes.Provider, id string, cmd ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("Exec %q: %v", cmd, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("%q: exit %d, stderr %q", cmd, res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout)
}

// py runs Python code in sandbox id (execOK).
func py(t *testing.T, p *kubernetes.Provider, id, code string) string {
	t.Helper()
	return execOK(t, p, id, "python3", "-c", code)
}

// TestPostureFromInside: what the sandbox's code sees of its privileges.
func TestPostureFromInside(t *testing.T) {
	p := newProvider(t)
	sb := create(t, p, baseConfig())
	got := py(t, p, sb.ID, `
import os
st = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)
print(*(st[k].split()[0] for k in ('CapEff', 'CapPrm', 'CapBnd', 'CapInh', 'CapAmb', 'NoNewPrivs', 'Seccomp', 'Uid')))`)
	f := strings.Fields(got)
	if len(f) != 8 {
		t.Fatalf("status probe printed %q", got)
	}
	for i, name := range []string{"CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"} {
		if f[i] != "0000000000000000" {
			t.Errorf("%s %s, want 0", name, f[i])
		}
	}
	if f[5] != "1" {
		t.Errorf("NoNewPrivs %s, want 1", f[5])
	}
	if f[6] != "2" {
		t.Errorf("Seccomp %s, want 2 (filter)", f[6])
	}
	if f[7] == "0" {
		t.Errorf("uid 0: the sandbox's code runs as root")
	}
	if got := py(t, p, sb.ID, `
import errno
try:
    open('/roche-probe', 'w'); print('written')
except OSError as e:
    print(errno.errorcode[e.errno])`); got != "EROFS" {
		t.Errorf("writing to /: %s, want EROFS", got)
	}
	if got := py(t, p, sb.ID, "import os; print(' '.join(sorted(os.listdir('/sys/class/net'))))"); got != "lo" {
		t.Errorf("interfaces with network off: %q, want lo", got)
	}
	// No service account token, no service environment variables (but the API
	// server's own, which the kubelet always sets).
	if got := py(t, p, sb.ID, `
import os
print(os.path.exists('/var/run/secrets/kubernetes.io'), any(k.endswith('_SERVICE_HOST') and k != 'KUBERNETES_SERVICE_HOST' for k in os.environ))`); got != "False False" {
		t.Errorf("service account token present, service links present: %s, want False False", got)
	}
}

// TestAgentUnreachableFromInside: the sandbox's code cannot connect to the agent's
// socket, list its directory, or replace the agent.
func TestAgentUnreachableFromInside(t *testing.T) {
	p := newProvider(t)
	sb := create(t, p, baseConfig())
	got := py(t, p, sb.ID, `
import errno, os, socket
out = []
s = socket.socket(socket.AF_UNIX)
try:
    s.connect('/.roche/run/agent.sock'); out.append('connected')
except OSError as e:
    out.append(errno.errorcode[e.errno])
try:
    os.listdir('/.roche/run'); out.append('listed')
except OSError as e:
    out.append(errno.errorcode[e.errno])
for path in ('/.roche/roche-agent', '/.roche/other'):
    try:
        open(path, 'wb').write(b'x'); out.append('written')
    except OSError as e:
        out.append(errno.errorcode[e.errno])
print(*out)`)
	if got != "EACCES EACCES EACCES EACCES" {
		t.Fatalf("from inside: connect, list, overwrite the agent, add a file: %q, want EACCES for each", got)
	}
}

// TestDestroyLeavesNothing: a sandbox with its network off has a deny-all NetworkPolicy
// beside its Pod while it lives, and neither survives Destroy.
func TestDestroyLeavesNothing(t *testing.T) {
	p := newProvider(t)
	cs := clientset(t)
	ctx := context.Background()
	sb := create(t, p, baseConfig())
	pod, err := cs.CoreV1().Pods(p.Namespace()).Get(ctx, sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels["roche.network"] != "none" || pod.Labels["roche.managed"] != "true" || pod.Labels["roche.provider"] != "kubernetes" {
		t.Errorf("Pod labels %v", pod.Labels)
	}
	pol, err := cs.NetworkingV1().NetworkPolicies(p.Namespace()).Get(ctx, sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandbox's NetworkPolicy: %v", err)
	}
	if len(pol.Spec.Ingress) != 0 || len(pol.Spec.Egress) != 0 || len(pol.Spec.PolicyTypes) != 2 {
		t.Errorf("NetworkPolicy %+v is not deny-all", pol.Spec)
	}
	if len(pol.OwnerReferences) != 1 || pol.OwnerReferences[0].UID != pod.UID {
		t.Errorf("NetworkPolicy owners %+v, want the Pod", pol.OwnerReferences)
	}
	if err := p.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(p.Namespace()).Get(ctx, sb.ID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Pod after Destroy: %v, want not found", err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(p.Namespace()).Get(ctx, sb.ID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("NetworkPolicy after Destroy: %v, want not found", err)
	}
	list, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.ID == sb.ID {
			t.Errorf("List after Destroy still has %s", sb.ID)
		}
	}
	if _, err := p.Inspect(ctx, sb.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("Inspect after Destroy: %v, want ErrNotFound", err)
	}
}

// TestExpiredSandboxEndsAndIsCollected: at the end of its lifetime the Pod stops (the
// agent's lifetime, activeDeadlineSeconds behind it), and gc removes it by its label.
func TestExpiredSandboxEndsAndIsCollected(t *testing.T) {
	p := newProvider(t)
	cfg := baseConfig()
	cfg.TimeoutSecs = 5
	sb := create(t, p, cfg)
	ctx := context.Background()
	testenv.Eventually(t, time.Minute, "the expired sandbox to stop", func() bool {
		info, err := p.Inspect(ctx, sb.ID)
		return err == nil && info.State == roche.StateExited
	})
	removed, err := p.GC(ctx, roche.GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0].ID != sb.ID {
		t.Fatalf("GC removed %+v, want %s", removed, sb.ID)
	}
	if _, err := p.Inspect(ctx, sb.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("Inspect after GC: %v, want ErrNotFound", err)
	}
}

// TestBadKubeconfig: a kubeconfig that cannot be read gives one line that names it.
func TestBadKubeconfig(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(bad, []byte("this: [is not a kubeconfig\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(t.TempDir(), "missing")} {
		p, err := kubernetes.New(kubernetes.WithKubeconfig(path))
		if err != nil {
			t.Fatalf("New: %v, want the error on use", err)
		}
		_, err = p.Create(context.Background(), baseConfig())
		if !errors.Is(err, roche.ErrUnavailable) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), path) {
			t.Errorf("Create with kubeconfig %s: %q, want one line wrapping ErrUnavailable naming it", path, err)
		}
		if _, err := p.List(context.Background()); !errors.Is(err, roche.ErrUnavailable) {
			t.Errorf("List with kubeconfig %s: %v, want ErrUnavailable", path, err)
		}
	}
}

// TestPodSpecOnTheCluster: what the API server kept of the Pod is the secure mapping.
func TestPodSpecOnTheCluster(t *testing.T) {
	p := newProvider(t)
	sb := create(t, p, baseConfig())
	pod, err := clientset(t).CoreV1().Pods(p.Namespace()).Get(context.Background(), sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if *pod.Spec.AutomountServiceAccountToken || *pod.Spec.EnableServiceLinks || pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		t.Errorf("Pod spec %+v", pod.Spec)
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || *pod.Spec.ActiveDeadlineSeconds != 300 {
		t.Errorf("restart policy %s, active deadline %d", pod.Spec.RestartPolicy, *pod.Spec.ActiveDeadlineSeconds)
	}
	if c.Resources.Limits.Memory().Value() != 512<<20 || c.Resources.Limits.Cpu().MilliValue() != 1000 {
		t.Errorf("limits %v", c.Resources.Limits)
	}
}

// TestCancelledExecKillsCommand: a caller that gives up closes its exec stream through
// the API server, and the agent then kills the command with everything it started.
func TestCancelledExecKillsCommand(t *testing.T) {
	p := newProvider(t)
	sb := create(t, p, baseConfig())
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, sb.ID, roche.ExecRequest{
			Cmd:    []string{"sh", "-c", "echo started; sleep 1000 # roche-marker-cancel"},
			Stdout: writerFunc(func([]byte) { once.Do(func() { close(started) }) }),
		})
		done <- err
	}()
	select {
	case <-started:
	case <-time.After(time.Minute):
		t.Fatal("the command did not start")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Exec: %v, want context.Canceled", err)
	}
	testenv.Eventually(t, 30*time.Second, "the cancelled command to be killed", func() bool {
		return py(t, p, sb.ID, `
import os
n = 0
for d in os.listdir('/proc'):
    if d.isdigit() and int(d) != os.getpid():
        try: n += b'roche-marker-cancel' in open('/proc/%s/cmdline' % d, 'rb').read()
        except OSError: pass
print(n)`) == "0"
	})
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

// TestLeaseEndsWithItsHolder: a leased sandbox stops once the provider holding its lease
// (one exec stream through the API server) lets go, and one that was kept lives on.
func TestLeaseEndsWithItsHolder(t *testing.T) {
	holder := newProvider(t)
	observer, err := kubernetes.New(kubernetes.WithKubeconfig(testcluster.Kubeconfig(t)), kubernetes.WithNamespace(holder.Namespace()))
	if err != nil {
		t.Fatal(err)
	}
	cfg, opts := baseConfig(), kit.CreateOptions{Leased: true}
	leased := createFor(t, holder, cfg, opts)
	kept := createFor(t, holder, cfg, opts)
	ctx := context.Background()
	if err := holder.Keep(ctx, kept.ID); err != nil {
		t.Fatal(err)
	}
	if got := py(t, holder, leased.ID, "print('alive')"); got != "alive" {
		t.Fatalf("leased sandbox before its holder let go: %q", got)
	}
	dropped := time.Now()
	holder.Close()
	testenv.Eventually(t, time.Minute, "the leased sandbox to stop", func() bool {
		info, err := observer.Inspect(ctx, leased.ID)
		return err == nil && info.State == roche.StateExited
	})
	t.Logf("the leased sandbox stopped %v after its lease was let go", time.Since(dropped).Round(100*time.Millisecond))
	if got := py(t, observer, kept.ID, "print('alive')"); got != "alive" {
		t.Fatalf("kept sandbox after the holder let go: %q", got)
	}
}

// BenchmarkExec: one command through the API server (one pods/exec of the relay).
func BenchmarkExec(b *testing.B) {
	p, err := kubernetes.New(kubernetes.WithKubeconfig(testcluster.Kubeconfig(b)), kubernetes.WithNamespace(fmt.Sprintf("roche-bench-%x", rand.Uint64())))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteNamespace(b, clientset(b), p.Namespace()) })
	ctx := context.Background()
	info, err := p.Create(ctx, baseConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	b.ResetTimer()
	for b.Loop() {
		res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %v %+v", err, res)
		}
	}
}

// BenchmarkCreateDestroy: a sandbox made (scheduled, agent installed, answering) and
// destroyed.
func BenchmarkCreateDestroy(b *testing.B) {
	p, err := kubernetes.New(kubernetes.WithKubeconfig(testcluster.Kubeconfig(b)), kubernetes.WithNamespace(fmt.Sprintf("roche-bench-%x", rand.Uint64())))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { deleteNamespace(b, clientset(b), p.Namespace()) })
	ctx := context.Background()
	for b.Loop() {
		info, err := p.Create(ctx, baseConfig())
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Destroy(ctx, info.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBackgroundProcesses: a command started in the background is listed, its output
// kept, a signal reaches it, and its end is reported, all through the relay.
func TestBackgroundProcesses(t *testing.T) {
	p := newProvider(t)
	sb := create(t, p, baseConfig())
	ctx := context.Background()
	cmd, err := p.StartCommand(ctx, sb.ID, roche.CommandRequest{Cmd: []string{"sh", "-c", "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the background command to be listed running, its trap set", func() bool {
		list, err := p.Commands(ctx, sb.ID)
		return err == nil && len(list) == 1 && list[0].PID == cmd.PID && list[0].Running && list[0].Written.Stdout > 0
	})
	sel := roche.CommandSelector{PID: cmd.PID}
	if err := p.SignalCommand(ctx, sb.ID, sel, 15); err != nil {
		t.Fatal(err)
	}
	out, end, err := providertest.FollowCommand(ctx, t, p, sb.ID, sel, roche.CommandOffsets{})
	if err != nil {
		t.Fatal(err)
	}
	if end.ExitCode != 7 || out.Stdout.String() != "ready\ngot TERM\n" {
		t.Fatalf("connect: exit %d, %s; want 7 and the kept output", end.ExitCode, out)
	}
}

// TestNamespaceDeletedUnderProvider: the sandboxes' namespace deleted while the provider
// lives (an operator, a test cluster reset) does not break its creates: the next one makes
// the namespace again.
func TestNamespaceDeletedUnderProvider(t *testing.T) {
	p := newProvider(t)
	first := create(t, p, baseConfig())
	deleteNamespace(t, clientset(t), p.Namespace())
	if _, err := p.Inspect(context.Background(), first.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("a sandbox of the deleted namespace: %v, want ErrNotFound", err)
	}
	again := create(t, p, baseConfig())
	if got := py(t, p, again.ID, "print('back')"); got != "back" {
		t.Fatalf("a sandbox made after the namespace was deleted printed %q", got)
	}
}
