package daemon

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// TestAgentKilledEndsKubernetes: the roche-agent of a sandbox Pod on the test cluster is
// killed -9 from the node (the cluster admin's reach, not the sandbox's), and roched,
// through the provider's watch of its Pods, says agent_exited with the kubelet's
// container status (exit 137) as evidence.
func TestAgentKilledEndsKubernetes(t *testing.T) {
	cluster := testcluster.Start(t)
	cl := cluster.Client(t)
	t.Cleanup(cl.Close) // last: the namespace's cleanup below uses it
	ns := cl.Namespace(t, "roche-daemon-agent")
	importAgentImage(t)
	socket := filepath.Join(shortDir(t), "r.sock")
	r := startRochedEnv(t, socket, nil, "--kubeconfig", cluster.Kubeconfig, "--namespace", ns)
	c, err := client.New(client.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		stopRoched(t, r)
		if left := k8sPods(t, cl, ns); len(left) != 0 {
			t.Errorf("Pods left behind: %v", left)
		}
	})
	ctx := ctxFor(t, 3*time.Minute)
	p := c.Provider(kubernetes.Name)
	sb, _, err := c.Create(ctx, kubernetes.Name, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), sb.ID) })
	if res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec in the new sandbox: %+v %v", res, err)
	}

	// The sandbox container's id, from the kubelet's status of the Pod named by the
	// sandbox, and its PID 1 (roche-agent) on the node: the process in the container's
	// cgroup whose parent (the runtime's shim) is not.
	var pod struct {
		Status struct {
			ContainerStatuses []struct {
				Name        string `json:"name"`
				ContainerID string `json:"containerID"`
			} `json:"containerStatuses"`
		} `json:"status"`
	}
	if err := cl.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+sb.ID, nil, &pod); err != nil {
		t.Fatal(err)
	}
	var cid string
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == "sandbox" {
			_, cid, _ = strings.Cut(cs.ContainerID, "://")
		}
	}
	if len(cid) < 32 {
		t.Fatalf("no container id of the sandbox container in %+v", pod.Status)
	}
	agent := containerInit(t, cid)
	if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(agent) + "/comm"); strings.TrimSpace(string(comm)) != "roche-agent" {
		t.Fatalf("pid %d, the init of container %s, is %q, not roche-agent", agent, cid, comm)
	}
	if err := syscall.Kill(agent, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", agent, err)
	}
	var got roche.SandboxInfo
	eventually(t, time.Minute, "roched to record the end of "+sb.ID, func() bool {
		got, err = p.InspectEnded(context.Background(), sb.ID)
		return err == nil && got.End != nil && got.End.Kind != roche.EndUnknown
	})
	t.Logf("%s: %s", sb.ID, got.End)
	if got.State != roche.StateExited || got.End.Kind != roche.EndAgentExited || !got.End.ExitKnown || got.End.ExitCode != 137 ||
		!strings.Contains(got.End.Evidence, "exit code 137") {
		t.Fatalf("a sandbox whose roche-agent was killed -9 ended %s %+v, want exited, agent_exited, exit 137 with the container status as evidence", got.State, *got.End)
	}
}

// containerInit finds the node pid of container cid's PID 1: the process whose cgroup
// names the container and which is 1 in its own pid namespace (NSpid). Others there may
// have a parent outside the container too (the provider's execs).
func containerInit(t *testing.T, cid string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cgroup"); err != nil || !strings.Contains(string(b), cid) {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if f := strings.Fields(v); len(f) > 1 && f[len(f)-1] == "1" {
					if found != 0 {
						t.Fatalf("two PID 1s of container %s: %d and %d", cid, found, pid)
					}
					found = pid
				}
			}
		}
	}
	if found == 0 {
		t.Fatalf("no PID 1 of container %s on this node", cid)
	}
	return found
}
