// Package deploy_test applies deploy/kubernetes to the test cluster, as an operator
// would, and runs the SDKs against the roched it starts.
package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// fieldManager owns what the test applies (server-side apply, as kubectl apply
// --server-side).
const fieldManager = "roche-deploy-test"

// TestRochedInCluster: the images written by the CLI and imported into the node, the
// kustomization applied into a namespace of the test's own with its token Secret, the
// Deployment ready, then, through a port-forward of the API server (no route into the
// Pod network), the Python SDK makes a sandbox, runs a command and destroys it while the
// Go client and the API server look on. The Role is checked to be enough (no Forbidden
// in roched's log) and no more than the calls the provider makes. Last, roched's Pod is
// replaced and the new one serves a sandbox the old one made.
func TestRochedInCluster(t *testing.T) {
	testenv.Needs(t, testenv.Cluster, testenv.Python)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := deploy(ctx, t, "")
	cfg, cs, ns, token, agentRef := d.cfg, d.cs, d.ns, d.token, d.agentRef
	pod := d.pods[0]
	addr := forward(t, cfg, cs, ns, pod.Name)

	c, err := client.New(client.WithAddress(addr), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := c.Health(ctx)
	if err != nil {
		t.Fatalf("roched's health through the port-forward: %v", err)
	}
	if !slices.Equal(h.Providers, []string{kubernetes.Name}) || h.Status != "ok" {
		t.Fatalf("roched in the cluster is %s serving %v, want ok serving the kubernetes provider alone", h.Status, h.Providers)
	}

	start := time.Now()
	sb := runPython(ctx, t, addr, token, pod.Status.PodIP, func(id string) {
		// While the SDK holds it: the sandbox's Pod is in the namespace, labelled as
		// Roche's, its agent from the image imported beside roched's, and the Go client
		// lists it.
		p, err := cs.CoreV1().Pods(ns).Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the sandbox's Pod: %v", err)
		}
		if p.Labels[kubernetes.LabelManaged] != "true" || p.Labels[kubernetes.LabelProvider] != kubernetes.Name {
			t.Errorf("the sandbox's Pod has labels %v, not Roche's", p.Labels)
		}
		if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != agentRef {
			t.Errorf("the sandbox's init container runs %v, want the agent image %s", p.Spec.InitContainers, agentRef)
		}
		list, err := c.Provider(kubernetes.Name).List(ctx)
		if err != nil || len(list) != 1 || list[0].ID != id {
			t.Errorf("the Go client lists %v (%v), want the one sandbox %s", list, err, id)
		}
	})
	t.Logf("the Python SDK's create, two execs and destroy: %.1f s; from inside the sandbox: %s", time.Since(start).Seconds(), sb.reach)
	if sb.stdout != "hello from a Pod" {
		t.Errorf("exec printed %q", sb.stdout)
	}
	// The sandbox (network off by default) cannot open roched's API port.
	if !strings.HasPrefix(sb.reach, "unreachable") {
		t.Errorf("from inside the sandbox, roched's Pod at %s:7878: %s", pod.Status.PodIP, sb.reach)
	}
	testenv.Eventually(t, 30*time.Second, "the sandbox's Pod and NetworkPolicy gone after destroy", func() bool {
		pods, err1 := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kubernetes.LabelManaged + "=true"})
		pols, err2 := cs.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
		return err1 == nil && err2 == nil && len(pods.Items) == 0 && len(pols.Items) == 0
	})

	logs, err := cs.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(bytes.ToLower(logs), []byte("forbidden")) {
		t.Errorf("roched was refused a call; its Role lacks something:\n%s", logs)
	}
	if !bytes.Contains(logs, []byte(sb.id)) {
		t.Errorf("roched's log does not mention sandbox %s (the audit lines):\n%s", sb.id, logs)
	}
	checkRole(ctx, t, cs, ns)

	checkReplaced(ctx, t, cfg, cs, ns, pod.Name, c, token)
}

// deployed is roched applied from this directory's kustomization into a namespace of
// the test's own.
type deployed struct {
	cluster             *testcluster.Cluster
	cfg                 *rest.Config
	cs                  k8s.Interface
	ns, token           string
	agentRef, rochedRef string
	pods                []*corev1.Pod // roched's ready Pods
}

// deploy writes the agent's and roched's images with the CLI and imports them into the
// node, makes a namespace (deleted at the end, also on failure) with the token Secret,
// applies an overlay of the kustomization with patches (a kustomize patches list, "" for
// none) there and waits for the Deployment's Pods to be ready, as many as it asks for.
func deploy(ctx context.Context, t *testing.T, patches string) *deployed {
	t.Helper()
	cluster := testcluster.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &deployed{cluster: cluster, cfg: cfg, cs: cs, token: randomHex(16)}
	d.agentRef, d.rochedRef = writeImages(t)
	d.ns = cluster.Client(t).Namespace(t, "roche-deploy")
	if _, err := cs.CoreV1().Secrets(d.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "roched-token"},
		StringData: map[string]string{"token": d.token},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	objs := build(t, d.ns, d.rochedRef, patches)
	start := time.Now()
	apply(ctx, t, cfg, d.ns, objs)
	d.pods = waitRoched(ctx, t, cs, d.ns, "")
	t.Logf("%d roched ready %.1f s after the apply", len(d.pods), time.Since(start).Seconds())
	return d
}

// checkReplaced: a roched Pod replaced by another (new Pod, new emptyDir state, the same
// host name) serves the sandboxes the one before made, which a client kept (unleased):
// the new roched knows them as its own lost state's and adopts them.
func checkReplaced(ctx context.Context, t *testing.T, cfg *rest.Config, cs k8s.Interface, ns, old string, c *client.Client, token string) {
	t.Helper()
	sbCfg := roche.DefaultConfig()
	sbCfg.Image = testenv.Image()
	sb, err := c.Provider(kubernetes.Name).Create(ctx, sbCfg)
	if err != nil {
		t.Fatalf("creating a sandbox with the Go client: %v", err)
	}
	// Its connection through the old Pod's port-forward would break (and client-go say so).
	c.Close()
	start := time.Now()
	if err := cs.CoreV1().Pods(ns).Delete(ctx, old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := waitRoched(ctx, t, cs, ns, old)[0]
	t.Logf("roched's Pod replaced in %.1f s", time.Since(start).Seconds())
	c2, err := client.New(client.WithAddress(forward(t, cfg, cs, ns, pod.Name)), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	p := c2.Provider(kubernetes.Name)
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"echo", "still here"}})
	if err != nil || strings.TrimSpace(res.Stdout) != "still here" {
		t.Fatalf("the new roched does not serve sandbox %s of the one before: %v %+v%s", sb.ID, err, res, describePods(cs, ns))
	}
	if err := p.Destroy(ctx, sb.ID); err != nil {
		t.Fatalf("destroying sandbox %s through the new roched: %v", sb.ID, err)
	}
	testenv.Eventually(t, 30*time.Second, "sandbox "+sb.ID+"'s Pod gone after its destroy", func() bool {
		_, err := cs.CoreV1().Pods(ns).Get(ctx, sb.ID, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// writeImages builds roche, roched and roche-agent, writes the agent image and roched's
// with the CLI an operator uses, imports both into the node and removes them when the
// test ends. It returns their references.
func writeImages(t *testing.T) (agentRef, rochedRef string) {
	t.Helper()
	dir := t.TempDir()
	rocheBin, _, err := testenv.BuildCLI(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.BuildAgent(dir); err != nil {
		t.Fatal(err)
	}
	write := func(what, file string) string {
		tar := filepath.Join(dir, file)
		cmd := exec.Command(rocheBin, "kubernetes", what, "--output", tar)
		// roche finds roched and roche-agent beside itself.
		cmd.Env = append(os.Environ(), "ROCHE_AGENT="+filepath.Join(dir, "roche-agent"))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("roche kubernetes %s: %v", what, err)
		}
		ref := strings.TrimSpace(string(out))
		t.Cleanup(func() { testcluster.RemoveImage(t, ref) })
		testcluster.ImportTar(t, tar)
		return ref
	}
	return write("agent-image", "agent.tar"), write("roched-image", "roched.tar")
}

// build runs kustomize (the library kubectl apply -k embeds) over an overlay of this
// directory's kustomization, as docs/roched-in-a-cluster.md tells operators to write one: the test's
// namespace and the roched image's tag.
func build(t *testing.T, ns, rochedRef, patches string) []*unstructured.Unstructured {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	base, err := filepath.Glob("*.yaml")
	if err != nil || len(base) == 0 {
		t.Fatalf("no manifests beside the test (%v)", err)
	}
	for _, f := range base {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile("/base/"+f, b); err != nil {
			t.Fatal(err)
		}
	}
	repo, tag, _ := strings.Cut(rochedRef, ":")
	overlay := fmt.Sprintf("resources: [../base]\nnamespace: %s\nimages: [{name: %s, newTag: %q}]\n%s", ns, repo, tag, patches)
	if err := fs.WriteFile("/overlay/kustomization.yaml", []byte(overlay)); err != nil {
		t.Fatal(err)
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/overlay")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	var objs []*unstructured.Unstructured
	kinds := map[string]bool{}
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetNamespace() != ns {
			t.Errorf("%s %s lands in namespace %q, not the kustomization's %q", u.GetKind(), u.GetName(), u.GetNamespace(), ns)
		}
		kinds[u.GetKind()] = true
		objs = append(objs, u)
	}
	for _, k := range []string{"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"} {
		if !kinds[k] {
			t.Errorf("the kustomization makes no %s", k)
		}
	}
	if len(objs) != 5 {
		t.Errorf("the kustomization makes %d objects, want 5: %v", len(objs), kinds)
	}
	return objs
}

// apply applies objs server-side, each to the resource the API server's discovery maps
// its kind to.
func apply(ctx context.Context, t *testing.T, cfg *rest.Config, ns string, objs []*unstructured.Unstructured) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	force := true
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		if m.Scope.Name() != meta.RESTScopeNameNamespace {
			t.Fatalf("%s %s is not namespaced: the kustomization must stay in its namespace", gvk.Kind, u.GetName())
		}
		b, err := json.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dyn.Resource(m.Resource).Namespace(ns).Patch(ctx, u.GetName(), types.ApplyPatchType, b,
			metav1.PatchOptions{FieldManager: fieldManager, Force: &force}); err != nil {
			t.Fatalf("applying %s %s: %v", gvk.Kind, u.GetName(), err)
		}
	}
}

// waitRoched waits until roched's Deployment is rolled out and as many Pods as it asks
// for, none of them replaced, are ready (their readiness probe is /healthz), and returns
// them; on a timeout it fails with the Pods' states and logs.
func waitRoched(ctx context.Context, t *testing.T, cs k8s.Interface, ns, replaced string) []*corev1.Pod {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var status string
	for {
		d, err := cs.AppsV1().Deployments(ns).Get(wctx, "roched", metav1.GetOptions{})
		if err != nil {
			status = err.Error()
		} else {
			st, _ := json.Marshal(d.Status)
			status = string(st)
			want := int32(1)
			if d.Spec.Replicas != nil {
				want = *d.Spec.Replicas
			}
			if d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want {
				if ps := readyPods(wctx, cs, ns, replaced); len(ps) == int(want) {
					return ps
				}
			}
		}
		select {
		case <-wctx.Done():
			t.Fatalf("roched's Pods not ready within 90 s (Deployment status %s)%s", status, describePods(cs, ns))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// readyPods are roched's ready Pods not being deleted, other than replaced.
func readyPods(ctx context.Context, cs k8s.Interface, ns, replaced string) []*corev1.Pod {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=roched"})
	if err != nil {
		return nil
	}
	var out []*corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Name == replaced || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				out = append(out, p)
			}
		}
	}
	return out
}

// describePods is the namespace's Pods, their containers' states and roched's log, for
// a failure message.
func describePods(cs k8s.Interface, ns string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "; listing the Pods: " + err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "\nPod %s: %s %s", p.Name, p.Status.Phase, p.Status.Message)
		for _, s := range p.Status.ContainerStatuses {
			st, _ := json.Marshal(s.State)
			fmt.Fprintf(&b, "\n  %s: %s", s.Name, st)
		}
		if logs, err := cs.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx); err == nil {
			fmt.Fprintf(&b, "\n  log:\n%s", logs)
		}
	}
	return b.String()
}

// forward port-forwards a local port to roched's API port in its Pod, through the API
// server, until the test ends, and returns the address for the SDKs.
func forward(t *testing.T, cfg *rest.Config, cs k8s.Interface, ns, pod string) string {
	t.Helper()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	url := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	stop, ready := make(chan struct{}), make(chan struct{})
	var errOut testenv.SyncBuffer
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:7878"}, stop, ready, io.Discard, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("port-forward to %s: %v %s", pod, err, errOut.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("port-forward to %s not ready in 30 s: %s", pod, errOut.String())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("port-forward ports %v: %v", ports, err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", ports[0].Local)
}

// pythonSDK makes a sandbox with the Python SDK (sdk/python, from this checkout), runs
// a command in it, tries roched's port from inside, then waits for a line on stdin
// while the test looks, and destroys it on leaving the with block.
const pythonSDK = `
import sys
from roche_sandbox import Roche
address, image, roched_ip = sys.argv[1:4]
roche = Roche("kubernetes", address=address, transport="daemon")
with roche.create(image=image) as sb:
    print("created", sb.id, flush=True)
    print("stdout", sb.exec(["python3", "-c", "print('hello from a Pod')"]).stdout.strip(), flush=True)
    probe = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(({roched_ip!r}, 7878), timeout=3)\n"
        "    print('reached')\n"
        "except OSError as e:\n"
        "    print('unreachable', e)\n"
    )
    print("reach", sb.exec(["python3", "-c", probe]).stdout.strip(), flush=True)
    sys.stdin.readline()
print("destroyed", flush=True)
`

// pythonRun is what the Python SDK saw.
type pythonRun struct{ id, stdout, reach string }

// runPython runs pythonSDK against addr; look is called with the sandbox's id while the
// sandbox is held.
func runPython(ctx context.Context, t *testing.T, addr, token, rochedIP string, look func(id string)) pythonRun {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 not found: the Python SDK's check needs Python 3.10+ (scripts/test.sh installs it)")
	}
	sdk, err := filepath.Abs(filepath.Join("..", "..", "sdk", "python", "src"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "python3", "-c", pythonSDK, addr, testenv.Image(), rochedIP)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+sdk, "ROCHE_TOKEN="+token)
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var run pythonRun
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		key, val, _ := strings.Cut(lines.Text(), " ")
		switch key {
		case "created":
			run.id = val
		case "stdout":
			run.stdout = val
		case "reach":
			run.reach = val
			look(run.id)
			stdin.Close()
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the Python SDK against roched in the cluster: %v\n%s", err, stderr.String())
	}
	if run.id == "" {
		t.Fatalf("the Python SDK made no sandbox:\n%s", stderr.String())
	}
	return run
}

// checkRole asks the API server what roched's ServiceAccount may do: every call the
// provider makes in its namespace, and none of the others below.
func checkRole(ctx context.Context, t *testing.T, cs k8s.Interface, ns string) {
	t.Helper()
	type access struct{ ns, group, resource, sub, verb string }
	may := []access{
		{ns, "", "pods", "", "create"}, {ns, "", "pods", "", "get"}, {ns, "", "pods", "", "list"}, {ns, "", "pods", "", "delete"},
		{ns, "", "pods", "", "patch"}, // a warm pool's claim
		{ns, "", "pods", "", "watch"}, // how a sandbox ended (kit.Watcher)
		{ns, "", "pods", "exec", "create"}, {ns, "", "pods", "exec", "get"},
		{ns, "networking.k8s.io", "networkpolicies", "", "create"}, {ns, "networking.k8s.io", "networkpolicies", "", "patch"},
		{ns, "networking.k8s.io", "networkpolicies", "", "list"}, {ns, "networking.k8s.io", "networkpolicies", "", "delete"},
		{ns, "", "configmaps", "", "create"}, {ns, "", "configmaps", "", "patch"}, // an egress CA's certificate
		{ns, "", "configmaps", "", "list"}, {ns, "", "configmaps", "", "delete"},
		{ns, "", "events", "", "list"}, // why a Pod's sandbox, or its workspace's volume, could not be made
		// Workspaces.
		{ns, "", "persistentvolumeclaims", "", "create"}, {ns, "", "persistentvolumeclaims", "", "get"},
		{ns, "", "persistentvolumeclaims", "", "list"}, {ns, "", "persistentvolumeclaims", "", "patch"},
		{ns, "", "persistentvolumeclaims", "", "delete"},
		{ns, "coordination.k8s.io", "leases", "", "get"}, {ns, "coordination.k8s.io", "leases", "", "create"},
		{ns, "coordination.k8s.io", "leases", "", "update"}, // a replica group's leader election
	}
	mayNot := []access{
		{ns, "", "secrets", "", "get"}, {ns, "", "secrets", "", "list"},
		{ns, "", "pods", "", "update"}, {ns, "", "configmaps", "", "get"}, {ns, "", "configmaps", "", "update"},
		{ns, "", "pods", "attach", "create"}, {ns, "", "pods", "portforward", "create"}, {ns, "", "pods", "ephemeralcontainers", "patch"},
		{ns, "", "serviceaccounts", "token", "create"}, {ns, "rbac.authorization.k8s.io", "roles", "", "create"},
		{"default", "", "pods", "", "create"}, {"default", "", "pods", "exec", "create"},
		{ns, "coordination.k8s.io", "leases", "", "delete"}, {"kube-system", "coordination.k8s.io", "leases", "", "update"},
		{"", "", "namespaces", "", "create"}, {"", "", "nodes", "", "list"},
		{ns, "", "persistentvolumeclaims", "", "update"}, {"", "", "persistentvolumes", "", "delete"},
		{"", "storage.k8s.io", "storageclasses", "", "create"}, {"default", "", "persistentvolumeclaims", "", "create"},
	}
	user := "system:serviceaccount:" + ns + ":roched"
	allowed := func(a access) bool {
		r, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authv1.SubjectAccessReview{Spec: authv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authv1.ResourceAttributes{
				Namespace: a.ns, Group: a.group, Resource: a.resource, Subresource: a.sub, Verb: a.verb,
			},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Allowed
	}
	for _, a := range may {
		if !allowed(a) {
			t.Errorf("roched may not %s %s/%s in %q", a.verb, a.resource, a.sub, a.ns)
		}
	}
	for _, a := range mayNot {
		if allowed(a) {
			t.Errorf("roched may %s %s/%s in %q, which it never does", a.verb, a.resource, a.sub, a.ns)
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
