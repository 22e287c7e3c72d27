package daemon

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// k8sPod is the part of a sandbox's Pod these tests read.
type k8sPod struct {
	Metadata struct {
		Name        string            `json:"name"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		ActiveDeadlineSeconds int64 `json:"activeDeadlineSeconds"`
	} `json:"spec"`
}

// k8sPods lists the Pods of a namespace by name.
func k8sPods(t *testing.T, cl *testcluster.Client, ns string) map[string]k8sPod {
	t.Helper()
	var list struct {
		Items []k8sPod `json:"items"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := cl.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods", nil, &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]k8sPod{}
	for _, p := range list.Items {
		out[p.Metadata.Name] = p
	}
	return out
}

// importAgentImage writes the agent image of this test's roche-agent and imports it into
// the test cluster's node, where the kubernetes provider's init containers find it.
func importAgentImage(t *testing.T) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "agent.tar"))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := kubernetes.WriteAgentImage(f, os.Getenv("ROCHE_AGENT"))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	testcluster.ImportTar(t, f.Name())
	t.Cleanup(func() { testcluster.RemoveImage(t, ref) })
}

// TestRochedKubernetesPool runs roched on the test cluster with a warm pool of Pods. A
// create is served by claiming an idle Pod: one patch gives it its client's owner, end and
// deadline, so the Pod's labels alone say whose it is. roched is then killed outright
// and started again without its state file: it finds the client's sandbox from those
// labels and serves it, and the idle Pods, held by the dead roched's lease, are gone.
func TestRochedKubernetesPool(t *testing.T) {
	cluster := testcluster.Start(t)
	cl := cluster.Client(t)
	t.Cleanup(cl.Close) // last: the namespace's cleanup below uses it
	ns := cl.Namespace(t, "roche-daemon-pool")
	importAgentImage(t)

	dir := shortDir(t)
	socket := filepath.Join(dir, "r.sock")
	state := filepath.Join(dir, "state.json")
	args := []string{"--state", state, "--kubeconfig", cluster.Kubeconfig, "--namespace", ns,
		"--pool", "kubernetes/" + testImage() + "?min=2&max=2"}
	r := startRochedEnv(t, socket, nil, args...)
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := ctxFor(t, 4*time.Minute)

	eventually(t, 2*time.Minute, "the pool to hold 2 idle Pods", func() bool {
		pools, err := c.PoolStatus(ctx)
		return err == nil && len(pools) == 1 && pools[0].Idle == 2
	})
	before := k8sPods(t, cl, ns)
	if len(before) != 2 {
		t.Fatalf("%d Pods in %s, want the pool's 2", len(before), ns)
	}

	cfg := pyConfig()
	cfg.TimeoutSecs = 120
	asked := time.Now()
	sb, pooled, err := c.Create(ctx, kubernetes.Name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !pooled {
		t.Fatalf("sandbox %s was made cold with 2 idle in the pool", sb.ID)
	}
	if _, ok := before[sb.ID]; !ok {
		t.Fatalf("sandbox %s is not one of the pool's Pods %v", sb.ID, before)
	}
	pod := k8sPods(t, cl, ns)[sb.ID]
	owner := pod.Metadata.Annotations[kubernetes.AnnotationOwner]
	if !strings.HasPrefix(owner, "roched:") || !strings.HasSuffix(owner, "/"+LocalTenant) {
		t.Errorf("claimed Pod's owner is %q, want roched's for tenant %s", owner, LocalTenant)
	}
	if was := before[sb.ID].Metadata.Annotations[kubernetes.AnnotationOwner]; strings.Contains(was, "/") {
		t.Errorf("idle Pod's owner was %q, a tenant's", was)
	}
	if got := pod.Metadata.Labels[kubernetes.LabelExpires]; got != strconv.FormatInt(sb.ExpiresAt.Unix(), 10) {
		t.Errorf("claimed Pod's %s label is %s, want the client's end %d (%s)", kubernetes.LabelExpires, got, sb.ExpiresAt.Unix(), sb.ExpiresAt)
	}
	if end := sb.ExpiresAt.Sub(asked); end < 115*time.Second || end > 125*time.Second {
		t.Errorf("the client's sandbox ends %s after the create, want its 120 s", end)
	}
	// The pool made it to live its idle time and then any lifetime up to 300 s; the claim
	// cut the kubelet's deadline to the client's end, counted from the Pod's start.
	if was, now := before[sb.ID].Spec.ActiveDeadlineSeconds, pod.Spec.ActiveDeadlineSeconds; now >= was || now < 120 || now > 120+int64(time.Since(asked.Add(-time.Minute)).Seconds()) {
		t.Errorf("activeDeadlineSeconds %d after the claim (was %d), want the client's 120 s from the claim", now, was)
	}
	kp := c.Provider(kubernetes.Name)
	res, err := kp.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "open('/tmp/mark', 'w').write('x'); print(6 * 7)"}})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "42" {
		t.Fatalf("exec in the claimed sandbox: %+v, %v", res, err)
	}

	// kill -9, and the state is lost with it.
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	r.cmd.Wait()
	if err := os.Remove(state); err != nil {
		t.Fatal(err)
	}
	r2 := startRochedEnv(t, socket, nil, args...)
	c2, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	list, err := c2.Provider(kubernetes.Name).List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(list, func(s roche.SandboxInfo) bool { return s.ID == sb.ID }); i < 0 {
		t.Fatalf("the restarted roched does not list the client's sandbox %s: %+v\n%s", sb.ID, list, r2.log)
	} else if !list[i].ExpiresAt.Equal(sb.ExpiresAt.Truncate(time.Second)) {
		t.Errorf("the restarted roched says %s ends at %s, want %s", sb.ID, list[i].ExpiresAt, sb.ExpiresAt)
	}
	res, err = c2.Provider(kubernetes.Name).Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"cat", "/tmp/mark"}})
	if err != nil || res.ExitCode != 0 || res.Stdout != "x" {
		t.Fatalf("exec in the adopted sandbox: %+v, %v", res, err)
	}
	eventually(t, time.Minute, "the dead roched's idle Pods to be gone", func() bool {
		now := k8sPods(t, cl, ns)
		for id := range before {
			if _, ok := now[id]; ok && id != sb.ID {
				return false
			}
		}
		return true
	})
	if err := c2.Provider(kubernetes.Name).Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	stopRoched(t, r2)
	if left := k8sPods(t, cl, ns); len(left) > 0 {
		t.Errorf("Pods left after a graceful stop: %v", left)
	}
}
