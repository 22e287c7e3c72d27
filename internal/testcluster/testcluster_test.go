package testcluster_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
)

const image = "roche/python:local"

// probe prints, as one JSON line, the Pod's network interfaces (from /proc/net/dev) and
// what came of a TCP connection to the node's API server port.
const probe = `
import json, socket, sys
ifaces = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    result = "connected"
except OSError as e:
    result = "error: " + str(e)
print(json.dumps({"ifaces": sorted(ifaces), "connect": result}))
`

// inCluster calls the API server the way in-cluster client configuration does (the
// kubernetes Service from the environment, the projected ServiceAccount token and CA) and
// prints the status code and message.
const inCluster = `
import json, os, ssl, urllib.request, urllib.error
sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
req = urllib.request.Request("https://%s:%s/api/v1/nodes" % (host, port),
    headers={"Authorization": "Bearer " + open(sa + "token").read()})
ctx = ssl.create_default_context(cafile=sa + "ca.crt")
try:
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        print(json.dumps({"code": r.status, "message": ""}))
except urllib.error.HTTPError as e:
    print(json.dumps({"code": e.code, "message": json.load(e).get("message", "")}))
`

func pod(name string, labels map[string]string, img string, command ...string) map[string]any {
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": name, "labels": labels},
		"spec": map[string]any{
			"restartPolicy":                "Never",
			"automountServiceAccountToken": false,
			"containers": []map[string]any{{
				"name":            "main",
				"image":           img,
				"imagePullPolicy": "Never",
				"command":         command,
			}},
		},
	}
}

// runPod creates a Pod (scheduled by the scheduler: no nodeName), waits for it to finish
// and returns its logs, read through the API server (which reads them from the kubelet).
func runPod(t *testing.T, cl *testcluster.Client, ns string, spec map[string]any) (*testcluster.Pod, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	name := spec["metadata"].(map[string]any)["name"].(string)
	if err := cl.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/pods", spec, nil); err != nil {
		t.Fatalf("creating Pod %s: %v", name, err)
	}
	p, err := cl.WaitPod(ctx, ns, name, "Succeeded", "Failed")
	if err != nil {
		t.Fatal(err)
	}
	logs, err := cl.Raw(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+name+"/log", nil)
	if err != nil {
		t.Fatalf("reading the logs of Pod %s: %v", name, err)
	}
	if p.Status.Phase != "Succeeded" {
		t.Fatalf("Pod %s ended %s (%s); logs:\n%s", name, p.Status.Phase, p.Status.Reason, logs)
	}
	return p, string(logs)
}

func TestPodRunsAndLogs(t *testing.T) {
	c := testcluster.Start(t)
	if _, err := os.Stat(testcluster.Kubeconfig(t)); err != nil {
		t.Fatalf("the admin kubeconfig: %v", err)
	}
	cl := c.Client(t)
	ns := cl.Namespace(t, "roche-tc")
	p, logs := runPod(t, cl, ns, pod("hello", nil, image, "python3", "-c", "import sys; print('hello from python', sys.version_info[0])"))
	if p.Spec.NodeName != c.Node {
		t.Errorf("Pod scheduled to %q, want the node %q", p.Spec.NodeName, c.Node)
	}
	if logs != "hello from python 3\n" {
		t.Errorf("logs = %q, want python3's greeting", logs)
	}
}

// TestNetworkOffIsLoopbackOnly is the test CNI's contract: a Pod labelled
// roche.network=none has lo and nothing else and cannot reach the node; a Pod without the
// label, made the same way, has eth0 and can (so the check can tell them apart).
func TestNetworkOffIsLoopbackOnly(t *testing.T) {
	c := testcluster.Start(t)
	cl := c.Client(t)
	ns := cl.Namespace(t, "roche-tc-net")
	type result struct {
		Ifaces  []string `json:"ifaces"`
		Connect string   `json:"connect"`
	}
	var onIP string
	run := func(name string, labels map[string]string) result {
		p, logs := runPod(t, cl, ns, pod(name, labels, image, "python3", "-c", probe, c.NodeIP, "6443"))
		onIP = p.Status.PodIP
		var r result
		if err := json.Unmarshal([]byte(strings.TrimSpace(logs)), &r); err != nil {
			t.Fatalf("Pod %s printed %q: %v", name, logs, err)
		}
		return r
	}

	off := run("off", map[string]string{"roche.network": "none"})
	if !slices.Equal(off.Ifaces, []string{"lo"}) {
		t.Errorf("network-off Pod has interfaces %v, want only lo", off.Ifaces)
	}
	if !strings.HasPrefix(off.Connect, "error:") {
		t.Errorf("network-off Pod reached the node at %s:6443: %s", c.NodeIP, off.Connect)
	}

	on := run("on", map[string]string{"roche.network": "bridge"})
	if !slices.Contains(on.Ifaces, "eth0") {
		t.Errorf("Pod with network has interfaces %v, want eth0 among them", on.Ifaces)
	}
	if _, subnet, err := net.ParseCIDR(c.PodSubnet); err != nil || !subnet.Contains(net.ParseIP(onIP)) {
		t.Errorf("Pod with network has address %q, want one from %s (host-local)", onIP, c.PodSubnet)
	}
	if on.Connect != "connected" {
		t.Errorf("Pod with network could not reach the node at %s:6443: %s", c.NodeIP, on.Connect)
	}

	// The kubelet stops a finished Pod's sandbox; the plugin's DEL must reach host-local,
	// which then frees the address it had reserved (one file per address).
	lease := filepath.Join(testcluster.StateDir(), "cni", "ipam", "roche-test", onIP)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(lease); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("address %s of the finished Pod is still reserved (%s) after 60 s", onIP, lease)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestImportDockerAndTar puts two new tags of the test image into the node, one from the
// Docker engine and one from a docker-save archive, and runs a Pod from each with image
// pulls forbidden, so only an import can have put them there.
func TestImportDockerAndTar(t *testing.T) {
	c := testcluster.Start(t)
	cl := c.Client(t)
	ns := cl.Namespace(t, "roche-tc-img")
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	suffix := hex.EncodeToString(rnd[:])

	tag := func(name string) {
		if out, err := exec.Command("docker", "tag", image, name).CombinedOutput(); err != nil {
			t.Fatalf("docker tag %s %s: %v\n%s", image, name, err, out)
		}
		t.Cleanup(func() {
			if out, err := exec.Command("docker", "rmi", name).CombinedOutput(); err != nil {
				t.Errorf("docker rmi %s: %v\n%s", name, err, out)
			}
		})
	}

	fromDocker := "roche/python:tc-docker-" + suffix
	tag(fromDocker)
	testcluster.ImportDocker(t, fromDocker)
	t.Cleanup(func() { testcluster.RemoveImage(t, fromDocker) })

	fromTar := "roche/python:tc-tar-" + suffix
	tag(fromTar)
	archive := filepath.Join(t.TempDir(), "image.tar")
	if out, err := exec.Command("docker", "save", "-o", archive, fromTar).CombinedOutput(); err != nil {
		t.Fatalf("docker save %s: %v\n%s", fromTar, err, out)
	}
	testcluster.ImportTar(t, archive)
	t.Cleanup(func() { testcluster.RemoveImage(t, fromTar) })

	for i, img := range []string{fromDocker, fromTar} {
		_, logs := runPod(t, cl, ns, pod("img-"+string(rune('a'+i)), nil, img, "python3", "-c", "print('ran')"))
		if strings.TrimSpace(logs) != "ran" {
			t.Errorf("Pod from %s printed %q, want ran", img, logs)
		}
	}
}

// TestInClusterAPI: a Pod reaches the API server through the kubernetes Service with its
// projected ServiceAccount token, as an in-cluster roched does, and is authenticated as
// that ServiceAccount (which RBAC then refuses the nodes list).
func TestInClusterAPI(t *testing.T) {
	c := testcluster.Start(t)
	cl := c.Client(t)
	ns := cl.Namespace(t, "roche-tc-sa")
	spec := pod("incluster", nil, image, "python3", "-c", inCluster)
	spec["spec"].(map[string]any)["automountServiceAccountToken"] = true
	_, logs := runPod(t, cl, ns, spec)
	var r struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(logs)), &r); err != nil {
		t.Fatalf("Pod printed %q: %v", logs, err)
	}
	want := "system:serviceaccount:" + ns + ":default"
	if r.Code != http.StatusForbidden || !strings.Contains(r.Message, want) {
		t.Errorf("in-cluster GET /api/v1/nodes = %d %q, want 403 naming %s", r.Code, r.Message, want)
	}
}

// TestPodTrafficStaysOnHost: a host the test places in a network namespace of its own,
// behind a veth pair, answers the host (a refused connection proves the packets got there)
// but not a Pod with network: the node forwards nothing from the Pod bridge to another
// interface, so Pods cannot reach beyond this machine.
func TestPodTrafficStaysOnHost(t *testing.T) {
	c := testcluster.Start(t)
	cl := c.Client(t)

	var rnd [2]byte
	_, _ = rand.Read(rnd[:])
	tag := hex.EncodeToString(rnd[:])
	netns, hostIf, nsIf := "roche-tc-"+tag, "rtc"+tag+"h", "rtc"+tag+"n"
	octet := 100 + int(rnd[0])%100
	hostIP := "198.18." + strconv.Itoa(octet) + ".1"
	target := "198.18." + strconv.Itoa(octet) + ".2"
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	sh("netns", "add", netns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", netns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", netns, err, out)
		}
	})
	sh("link", "add", hostIf, "type", "veth", "peer", "name", nsIf, "netns", netns)
	sh("addr", "add", hostIP+"/30", "dev", hostIf)
	sh("link", "set", hostIf, "up")
	sh("-n", netns, "addr", "add", target+"/30", "dev", nsIf)
	sh("-n", netns, "link", "set", nsIf, "up")
	sh("-n", netns, "link", "set", "lo", "up")
	// Replies to a Pod would need a way back; give one, so only the node's forwarding decides.
	sh("-n", netns, "route", "add", "default", "via", hostIP)

	// Nothing listens there: a refusal means the packets arrived.
	conn, err := net.DialTimeout("tcp", target+":8080", 5*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("something listens at %s:8080 in the test's own namespace", target)
	}
	if !strings.Contains(err.Error(), "refused") {
		t.Fatalf("the host cannot reach %s in namespace %s (%v): the check below would prove nothing", target, netns, err)
	}

	ns := cl.Namespace(t, "roche-tc-fwd")
	_, logs := runPod(t, cl, ns, pod("fwd", nil, image, "python3", "-c", probe, target, "8080"))
	var r struct {
		Ifaces  []string `json:"ifaces"`
		Connect string   `json:"connect"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(logs)), &r); err != nil {
		t.Fatalf("Pod printed %q: %v", logs, err)
	}
	if !slices.Contains(r.Ifaces, "eth0") {
		t.Fatalf("the Pod has no eth0 (%v): it should have network for this test", r.Ifaces)
	}
	if r.Connect == "connected" || strings.Contains(r.Connect, "refused") {
		t.Errorf("a Pod reached %s beyond the node: %s", target, r.Connect)
	}
}

// TestMakeClusterServesTheProvider: after make cluster, the Kubernetes provider works on
// the cluster as it is, as a user runs it: roche run --provider kubernetes, built as make
// build builds bin/, finds its agent image on the node, imported by make cluster, and
// runs the command.
func TestMakeClusterServesTheProvider(t *testing.T) {
	c := testcluster.Start(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mk := exec.Command("make", "-s", "cluster")
	mk.Dir = root
	out, err := mk.Output()
	if err != nil || !strings.HasPrefix(string(out), "export KUBECONFIG=") {
		t.Fatalf("make cluster: %v: %s", err, out)
	}
	bin := t.TempDir()
	if _, _, err := testenv.BuildCLI(bin); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.BuildAgent(bin); err != nil {
		t.Fatal(err)
	}
	ns := c.Client(t).Namespace(t, "roche-tc-provider")
	var rnd [4]byte
	rand.Read(rnd[:])
	cmd := exec.Command(filepath.Join(bin, "roche"), "--direct", "--kubeconfig", c.Kubeconfig, "--namespace", ns,
		"run", "--provider", "kubernetes", "--image", image, "--", "python3", "-c", "print(6 * 7)")
	cmd.Env = append(os.Environ(), "ROCHE_OWNER=cli:make-cluster-test-"+hex.EncodeToString(rnd[:]),
		"ROCHE_SOCKET="+filepath.Join(t.TempDir(), "none.sock"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	if err != nil || string(got) != "42\n" {
		t.Fatalf("roche run --provider kubernetes after make cluster: %v, stdout %q, stderr %q", err, got, stderr.String())
	}
}
