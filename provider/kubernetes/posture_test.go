package kubernetes_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/podlink"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// Attacks on what the kubelet and the runtime put into a sandbox's Pod, and on the
// isolation a create asks for, made from inside the sandbox or by the cluster itself.

func podOf(t *testing.T, p *kubernetes.Provider, id string) *corev1.Pod {
	t.Helper()
	pod, err := clientset(t).CoreV1().Pods(p.Namespace()).Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// kubeletFilesProbe tries, as the sandbox's code, to write 16 MiB into each file the
// kubelet or the runtime made for the container on the node's disk (the termination
// message file, at the default path and at the agent's, the hosts, hostname and resolver
// files) and into the agent's stdout and stderr, which the runtime writes to the
// container's log on the node. It prints path=ERRNO, or path=wrote:BYTES.
const kubeletFilesProbe = `
import errno, sys
out = []
for path in sys.argv[1:]:
    n = 0
    try:
        with open(path, 'ab', buffering=0) as f:
            while n < (16 << 20):
                n += f.write(b'x' * (1 << 20))
        out.append('%s=wrote:%d' % (path, n))
    except OSError as e:
        out.append('%s=%s' % (path, errno.errorcode.get(e.errno, str(e.errno))) if n == 0 else '%s=wrote:%d' % (path, n))
print(' '.join(out))`

// TestKubeletFilesOutOfReach: the kubelet makes the termination message file world-
// writable (0666) on the node's disk and puts no bound on it; at its default path
// (/dev/termination-log) a default sandbox wrote hundreds of MiB to the node. The sandbox
// container's is in the agent's directory, which the sandbox's code cannot enter, and no
// other file the kubelet or the runtime made, nor the agent's output (the container log),
// takes its writes: checked from inside, and on the node's files themselves.
func TestKubeletFilesOutOfReach(t *testing.T) {
	p := newProvider(t)
	sb := create(t, p, baseConfig())
	pod := podOf(t, p, sb.ID)
	if got := pod.Spec.Containers[0].TerminationMessagePath; got != podlink.TerminationLog {
		t.Errorf("terminationMessagePath %q, want %q", got, podlink.TerminationLog)
	}
	targets := []string{"/dev/termination-log", podlink.TerminationLog, "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/proc/1/fd/1", "/proc/1/fd/2"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: append([]string{"python3", "-c", kubeletFilesProbe}, targets...)})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("probe: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
	}
	t.Logf("from inside: %s", strings.TrimSpace(res.Stdout))
	results := strings.Fields(res.Stdout)
	if len(results) != len(targets) {
		t.Fatalf("probe printed %q", res.Stdout)
	}
	for _, r := range results {
		path, what, _ := strings.Cut(r, "=")
		if strings.HasPrefix(what, "wrote") || !strings.HasPrefix(what, "E") {
			t.Errorf("from inside, %s: %s, want an error", path, what)
		}
	}

	// On the node: the kubelet's termination message files of the sandbox container
	// (one per start), its hosts file, and the container's log, all still small.
	podDir := filepath.Join(testcluster.StateDir(), "kubelet", "pods", string(pod.UID))
	logs, err := filepath.Glob(filepath.Join(podDir, "containers", "sandbox", "*"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no termination message file of the sandbox container under %s (%v): the check would prove nothing", podDir, err)
	}
	for _, f := range logs {
		if size := fileSize(t, f); size != 0 {
			t.Errorf("the node's termination message file %s holds %d bytes, want 0", f, size)
		}
	}
	if size := fileSize(t, filepath.Join(podDir, "etc-hosts")); size > 4096 {
		t.Errorf("the node's hosts file of the Pod holds %d bytes", size)
	}
	containerLogs, err := filepath.Glob(filepath.Join(testcluster.StateDir(), "pod-logs", p.Namespace()+"_"+sb.ID+"_"+string(pod.UID), "sandbox", "*"))
	if err != nil || len(containerLogs) == 0 {
		t.Fatalf("no container log of the sandbox on the node (%v): the check would prove nothing", err)
	}
	for _, f := range containerLogs {
		if size := fileSize(t, f); size > 64<<10 {
			t.Errorf("the node's container log %s holds %d bytes after the attack", f, size)
		}
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// seccompProbe calls, as the sandbox's code, the system calls Roche's profile refuses and
// the container runtime's default allows (containerd 1.6's: io_uring, ptrace, modify_ldt,
// process_vm_readv, name_to_handle_at), and prints name=allowed or name=ERRNO for each.
// ptrace attaches to a child of its own, as a process without privileges may.
const seccompProbe = `
import ctypes, errno, os, platform, time
nr = {
    'x86_64': {'io_uring_setup': 425, 'ptrace': 101, 'modify_ldt': 154, 'process_vm_readv': 310, 'name_to_handle_at': 303},
    'aarch64': {'io_uring_setup': 425, 'ptrace': 117, 'process_vm_readv': 270, 'name_to_handle_at': 264},
}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr[name], *args)
    return name + '=' + ('allowed' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), '?'))
out = [call('io_uring_setup', 1, ctypes.create_string_buffer(120))]
if 'modify_ldt' in nr:
    out.append(call('modify_ldt', 0, ctypes.create_string_buffer(16), 16))
handle = ctypes.create_string_buffer(8 + 128)
ctypes.memmove(handle, (128).to_bytes(4, 'little'), 4)
out.append(call('name_to_handle_at', -100, b'/tmp', handle, ctypes.byref(ctypes.c_int()), 0))
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
buf = ctypes.create_string_buffer(8)
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
local, remote = iovec(ctypes.addressof(buf), 8), iovec(ctypes.addressof(buf), 8)
out.append(call('process_vm_readv', pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0))
out.append(call('ptrace', 16, pid, 0, 0))
os.kill(pid, 9)
os.waitpid(pid, 0)
print(' '.join(out))`

// TestSeccompByDefault: a sandbox made with no seccomp option runs under Roche's profile
// (installed on the node by the test cluster, as by an operator), not the runtime's
// default: the Pod asks for it, and from inside the calls it refuses fail with its
// EPERM, which the node's kernel itself serves.
func TestSeccompByDefault(t *testing.T) {
	hostServes(t)
	p := newProvider(t)
	sb := create(t, p, baseConfig())
	pod := podOf(t, p, sb.ID)
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		sp := c.SecurityContext.SeccompProfile
		if sp == nil || sp.Type != corev1.SeccompProfileTypeLocalhost || *sp.LocalhostProfile != kubernetes.DefaultSeccompProfile {
			t.Errorf("container %s: seccomp %+v, want Localhost %s", c.Name, sp, kubernetes.DefaultSeccompProfile)
		}
	}
	got := py(t, p, sb.ID, seccompProbe)
	t.Logf("from inside: %s", got)
	results := strings.Fields(got)
	if len(results) < 4 {
		t.Fatalf("probe printed %q", got)
	}
	for _, kv := range results {
		if name, result, _ := strings.Cut(kv, "="); result != "EPERM" {
			t.Errorf("%s inside the sandbox: %s, want EPERM from Roche's profile", name, result)
		}
	}
}

// hostServes checks that the node's kernel (this host's) serves io_uring, modify_ldt and
// ptrace to root, so that their failing inside is the filter's doing.
func hostServes(t *testing.T) {
	t.Helper()
	var params [120]byte
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if e != 0 {
		t.Fatalf("io_uring_setup on the host: %v: the check inside would prove nothing", e)
	}
	unix.Close(int(fd))
	if runtime.GOARCH == "amd64" {
		var ldt [16]byte
		if _, _, e := unix.Syscall(unix.SYS_MODIFY_LDT, 0, uintptr(unsafe.Pointer(&ldt[0])), uintptr(len(ldt))); e != 0 {
			t.Fatalf("modify_ldt on the host: %v: the check inside would prove nothing", e)
		}
	}
}

// TestNodeHasRochesProfile: the profile the test cluster installed on its node is the
// one this build writes (roche kubernetes seccomp-profile), so the checks above test
// Roche's profile as it is now.
func TestNodeHasRochesProfile(t *testing.T) {
	testcluster.Start(t)
	want, err := kubernetes.SeccompProfile()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(testcluster.StateDir(), "kubelet", "seccomp", kubernetes.DefaultSeccompProfile)
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the test cluster's node has no Roche profile: %v (scripts/k8s/cluster.sh up installs it)", err)
	}
	if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(want)) {
		t.Fatalf("%s is not the profile this build writes: run scripts/k8s/cluster.sh up from this checkout to install it again", path)
	}
}

// TestSeccompProfileMissing: a node without the profile the sandbox asks for fails the
// create at once, naming the profile and how to install it or choose the runtime's own,
// and leaves no Pod; the runtime's own is had only by naming it.
func TestSeccompProfileMissing(t *testing.T) {
	missing := fmt.Sprintf("roche-missing-%x.json", rand.Uint64())
	p := newProvider(t, kubernetes.WithSeccompProfile(missing))
	start := time.Now()
	_, err := p.Create(context.Background(), baseConfig())
	if !errors.Is(err, roche.ErrUnavailable) || strings.Contains(err.Error(), "\n") ||
		!strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "--seccomp-profile RuntimeDefault") {
		t.Fatalf("Create on a node without %s: %v, want one line wrapping ErrUnavailable that names it and --seccomp-profile RuntimeDefault", missing, err)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(10*time.Millisecond), err)
	noPods(t, p)

	explicit := newProvider(t, kubernetes.WithSeccompProfile(kubernetes.SeccompRuntimeDefault))
	sb := create(t, explicit, baseConfig())
	for _, c := range podOf(t, explicit, sb.ID).Spec.Containers {
		if sp := c.SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container %s: seccomp %+v, want RuntimeDefault as asked", c.Name, sp)
		}
	}
}

// noPods fails the test when the provider's namespace holds a Pod.
func noPods(t *testing.T, p *kubernetes.Provider) {
	t.Helper()
	pods, err := clientset(t).CoreV1().Pods(p.Namespace()).List(context.Background(), metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err == nil && len(pods.Items) > 0 {
		t.Errorf("a refused create left Pod %s", pods.Items[0].Name)
	}
}

// runtimeClass makes a RuntimeClass of the test's own with this handler, deleted at the end.
func runtimeClass(t *testing.T, handler string) string {
	t.Helper()
	return runtimeClassNamed(t, fmt.Sprintf("roche-test-%x", rand.Uint32()), handler)
}

// runtimeClassNamed makes RuntimeClass name with this handler, deleted at the end.
func runtimeClassNamed(t *testing.T, name, handler string) string {
	t.Helper()
	cs := clientset(t)
	if _, err := cs.NodeV1().RuntimeClasses().Create(context.Background(), &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: handler,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cs.NodeV1().RuntimeClasses().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting RuntimeClass %s: %v", name, err)
		}
	})
	return name
}

// TestRuntimeClass: a sandbox asked to run under a RuntimeClass runs under it or not at
// all. One the cluster does not define is refused with what to do, one whose handler the
// node's runtime lacks fails the create at once instead of leaving a Pod Pending while
// the kubelet retries, and neither leaves a Pod; one the node runs is what the Pod has.
func TestRuntimeClass(t *testing.T) {
	t.Run("Undefined", func(t *testing.T) {
		name := fmt.Sprintf("roche-test-undefined-%x", rand.Uint32())
		p := newProvider(t, kubernetes.WithRuntimeClass(name))
		_, err := p.Create(context.Background(), baseConfig())
		if !errors.Is(err, roche.ErrInvalidConfig) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "no such RuntimeClass") || !strings.Contains(err.Error(), name) {
			t.Fatalf("Create under an undefined RuntimeClass: %v, want one line wrapping ErrInvalidConfig that names it", err)
		}
		t.Logf("refused: %v", err)
		noPods(t, p)
	})
	t.Run("NoHandlerOnNode", func(t *testing.T) {
		name := runtimeClass(t, "roche-no-such-handler")
		p := newProvider(t, kubernetes.WithRuntimeClass(name), kubernetes.WithCreateTimeout(90*time.Second))
		start := time.Now()
		_, err := p.Create(context.Background(), baseConfig())
		if !errors.Is(err, roche.ErrUnavailable) || errors.Is(err, roche.ErrTimeout) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), name) {
			t.Fatalf("Create under a RuntimeClass whose handler the node lacks: %v, want one line wrapping ErrUnavailable naming it, before the create's deadline", err)
		}
		t.Logf("refused after %v: %v", time.Since(start).Round(10*time.Millisecond), err)
		noPods(t, p)
	})
	t.Run("NamedForGVisorRunsRunc", func(t *testing.T) {
		// Taken for gVisor by its name (gvisor.go), it runs the node's runc: no sandbox
		// may run. The agent, finding the host's kernel, refuses to start
		// (TestForkAsUserRefusedOffGVisor); on this test cluster's node runc fails even
		// before, as root here may not grant CAP_SYS_RESOURCE. Either way, the create
		// fails and leaves no Pod.
		name := runtimeClassNamed(t, fmt.Sprintf("roche-test-gvisor-%x", rand.Uint32()), "runc")
		p := newProvider(t, kubernetes.WithRuntimeClass(name), kubernetes.WithCreateTimeout(90*time.Second))
		_, err := p.Create(context.Background(), baseConfig())
		if err == nil || strings.Contains(err.Error(), "\n") {
			t.Fatalf("Create under RuntimeClass %s (handler runc): %v, want it refused in one line", name, err)
		}
		t.Logf("refused: %v", err)
		noPods(t, p)
	})
	t.Run("Runs", func(t *testing.T) {
		name := runtimeClass(t, "runc")
		p := newProvider(t, kubernetes.WithRuntimeClass(name))
		sb := create(t, p, baseConfig())
		if got := podOf(t, p, sb.ID).Spec.RuntimeClassName; got == nil || *got != name {
			t.Fatalf("the Pod's RuntimeClass %v, want %s", got, name)
		}
		if got := py(t, p, sb.ID, "print('ran')"); got != "ran" {
			t.Fatalf("under RuntimeClass %s: %q", name, got)
		}
	})
}

// egressFlood connects to the agent's egress proxy port N times and counts the 502s it
// answers (at once, before any request, when it cannot reach the host's proxy).
const egressFlood = `
import socket, sys
n = int(sys.argv[1])
bad = 0
for _ in range(n):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
    bad += s.recv(64).startswith(b'HTTP/1.1 502')
    s.close()
print(bad)`

// TestEgressFloodKeepsTheLogSmall: the agent's log is the container's log on the node's
// disk. A sandbox with an allowlist whose host proxy is gone (its roched stopped) gets a
// 502 for every connection to its proxy port, and however many it makes, the agent logs
// that a line a minute: checked on the node's log file.
func TestEgressFloodKeepsTheLogSmall(t *testing.T) {
	host := newProvider(t, kubernetes.WithEgressProxy())
	cfg := baseConfig()
	cfg.NetworkAllowlist = []string{"example.com"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := host.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The host process goes, leaving the sandbox (not leased) without its proxy.
	host.Close()
	other, err := kubernetes.New(kubernetes.WithKubeconfig(testcluster.Kubeconfig(t)), kubernetes.WithNamespace(host.Namespace()))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Destroy(context.Background(), sb.ID)
	const n = 3000
	res, err := other.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", egressFlood, fmt.Sprint(n)}, Timeout: 2 * time.Minute})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != fmt.Sprint(n) {
		t.Fatalf("flood: %v, exit %d, stdout %q, stderr %q; want %d refusals", err, res.ExitCode, res.Stdout, res.Stderr, n)
	}
	pod := podOf(t, other, sb.ID)
	logs, err := filepath.Glob(filepath.Join(testcluster.StateDir(), "pod-logs", other.Namespace()+"_"+sb.ID+"_"+string(pod.UID), "sandbox", "*"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no container log of the sandbox on the node (%v)", err)
	}
	var total int64
	for _, f := range logs {
		total += fileSize(t, f)
	}
	t.Logf("the node's container log: %d bytes after %d refused connections", total, n)
	if total > 4<<10 {
		t.Errorf("the node's container log holds %d bytes after %d refused connections, want a line or two", total, n)
	}
}
