package kubernetes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/podlink"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestPodForWorkspace: a workspace's claim is mounted at /workspace in the sandbox's
// container alone, and the agent is told to hand it to the sandbox user.
func TestPodForWorkspace(t *testing.T) {
	cfg := roche.DefaultConfig()
	cfg.Image = "roche/python:local"
	cfg.Workspace = "Proj_1"
	pp := testParams()
	pp.claim = claimName(cfg.Workspace)
	pod, err := podFor(kit.Spec{Config: cfg}, pp)
	if err != nil {
		t.Fatal(err)
	}
	if claimOf(pod) != pp.claim {
		t.Fatalf("the Pod mounts claim %q, want %q", claimOf(pod), pp.claim)
	}
	c := pod.Spec.Containers[0]
	if i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volumeWorkspace }); i < 0 || c.VolumeMounts[i].MountPath != roche.WorkspacePath || c.VolumeMounts[i].ReadOnly {
		t.Fatalf("sandbox container mounts %+v, want the workspace read-write at %s", c.VolumeMounts, roche.WorkspacePath)
	}
	if !slices.Contains(c.Command, "--own") || c.Command[slices.Index(c.Command, "--own")+1] != roche.WorkspacePath || c.Command[0] != podlink.Agent {
		t.Fatalf("agent command %q, want --own %s", c.Command, roche.WorkspacePath)
	}
	for _, ic := range pod.Spec.InitContainers {
		for _, m := range ic.VolumeMounts {
			if m.Name == volumeWorkspace {
				t.Fatalf("init container %s mounts the workspace", ic.Name)
			}
		}
	}
	// The claim's name holds only what an object's name may, whatever the workspace's.
	if n := claimName("Proj_1"); !strings.HasPrefix(n, claimPrefix) || n != strings.ToLower(n) || n == claimName("proj_1") {
		t.Fatalf("claimName: %q", n)
	}
}

// TestWorkspaceWithoutStorageClassRefused: a cluster with no default StorageClass leaves a
// new claim without one (no admission gives it one): the create is refused saying what
// to pass, and neither the claim nor a Pod is left.
func TestWorkspaceWithoutStorageClassRefused(t *testing.T) {
	cs := fake.NewClientset()
	p, err := New(WithClientset(cs, nil), WithAgentImage("roche/agent:x"), WithNamespace("ns"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := roche.DefaultConfig()
	cfg.Workspace = "proj"
	_, err = p.Create(context.Background(), cfg)
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "--kube-storage-class") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Create with no default StorageClass: %v, want one line of ErrUnavailable naming --kube-storage-class", err)
	}
	claims, _ := cs.CoreV1().PersistentVolumeClaims("ns").List(context.Background(), metav1.ListOptions{})
	pods, _ := cs.CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{})
	if len(claims.Items) != 0 || len(pods.Items) != 0 {
		t.Fatalf("left %d claims and %d Pods", len(claims.Items), len(pods.Items))
	}
}

// TestWorkspaceUIDHalves: sandboxes draw uids from the first half of the range,
// workspaces from the second, so a sandbox's own uid never is a workspace's.
func TestWorkspaceUIDHalves(t *testing.T) {
	p, err := New(WithClientset(fake.NewClientset(), nil), WithAgentImage("roche/agent:x"), WithUIDRange(100000, 10))
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if uid := p.drawWorkspaceUID(); uid < 100005 || uid > 100009 {
			t.Fatalf("workspace uid %d, want 100005-100009", uid)
		}
		if uid, err := p.drawUID(context.Background()); err != nil || uid < 100000 || uid > 100004 {
			t.Fatalf("sandbox uid %d (%v), want 100000-100004", uid, err)
		}
	}
	if _, err := New(WithClientset(fake.NewClientset(), nil), WithAgentImage("roche/agent:x"), WithStorageClass("Bad_Class")); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("storage class Bad_Class: %v, want ErrInvalidConfig", err)
	}
}
