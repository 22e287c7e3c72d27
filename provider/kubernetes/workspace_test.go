package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// TestWorkspaceClaim: a workspace is a PersistentVolumeClaim of the test cluster's default
// StorageClass, whose provisioner (roche-test-provisioner) makes an ext4 image of exactly
// its size: a file written there is kept across a reset and a destroy and create, writing
// past the size fails with "No space left on device" inside the sandbox, and once the
// workspace is removed the claim, its PersistentVolume, the image, its mount and its loop
// device are all gone. One sandbox at a time, three in all.
func TestWorkspaceClaim(t *testing.T) {
	testenv.Needs(t, testenv.Cluster, testenv.Root)
	p := newProvider(t)
	cs := clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	name := fmt.Sprintf("acme--proj-%x", rand.Uint32())
	cfg := baseConfig()
	cfg.Workspace, cfg.WorkspaceSize = name, "32m"

	first, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatalf("Create with a workspace: %v", err)
	}
	claims := cs.CoreV1().PersistentVolumeClaims(p.Namespace())
	list, err := claims.List(ctx, metav1.ListOptions{LabelSelector: "roche.managed=true,roche.tenant=acme,roche.workspace=" + name})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("the workspace's claim by its labels: %v, %v", list, err)
	}
	pvc := list.Items[0]
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != "roche-loop" || pvc.Status.Phase != corev1.ClaimBound {
		t.Fatalf("claim %s: class %v, phase %s; want roche-loop (the cluster's default), Bound", pvc.Name, pvc.Spec.StorageClassName, pvc.Status.Phase)
	}
	pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Spec.Local == nil {
		t.Fatalf("the claim's volume %s: %+v, %v; want a local volume", pvc.Spec.VolumeName, pv, err)
	}
	img := pv.Spec.Local.Path + ".img"
	if loops := loopDevices(t, img); len(loops) != 1 {
		t.Fatalf("loop devices of %s: %v, want one", img, loops)
	}

	got := sh(t, p, first.ID, "id -u; stat -c %u /workspace; echo kept > /workspace/f && cat /workspace/f")
	if f := strings.Fields(got); len(f) != 3 || f[0] != f[1] || f[0] != pvc.Labels["roche.uid"] || f[2] != "kept" {
		t.Fatalf("uid, /workspace's owner, a file written: %q, want the workspace's uid %s twice and kept", got, pvc.Labels["roche.uid"])
	}
	reset, err := p.Reset(ctx, first.ID, true)
	if err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if got := sh(t, p, reset.ID, "cat /workspace/f"); got != "kept" {
		t.Fatalf("after a reset keeping the workspace: %q, want kept", got)
	}
	if err := p.Destroy(ctx, reset.ID); err != nil {
		t.Fatal(err)
	}
	second, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatalf("Create again with the workspace: %v", err)
	}
	if got := sh(t, p, second.ID, "cat /workspace/f"); got != "kept" {
		t.Fatalf("in the next sandbox: %q, want kept", got)
	}
	res, err := p.Exec(ctx, second.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=64"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("writing 64 MiB to a 32 MiB workspace: exit %d, stderr %q; want No space left on device", res.ExitCode, res.Stderr)
	}
	if err := p.RemoveWorkspace(ctx, name); !errors.Is(err, roche.ErrInUse) {
		t.Fatalf("removing the workspace while %s mounts it: %v, want ErrInUse", second.ID, err)
	}
	if err := p.Destroy(ctx, second.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveWorkspace(ctx, name); err != nil {
		t.Fatalf("RemoveWorkspace: %v", err)
	}
	if _, err := claims.Get(ctx, pvc.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the claim after RemoveWorkspace: %v, want not found", err)
	}
	checkVolumeGone(t, cs, pv, img)
}

// TestWorkspaceStorageClassMissing: a workspace of a StorageClass the cluster lacks fails
// the create at once, naming the class, and leaves neither Pod nor claim.
func TestWorkspaceStorageClassMissing(t *testing.T) {
	testenv.Needs(t, testenv.Cluster)
	p := newProvider(t, kubernetes.WithStorageClass("no-such-class"))
	cs := clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := baseConfig()
	cfg.Workspace = fmt.Sprintf("w%x", rand.Uint32())
	start := time.Now()
	_, err := p.Create(ctx, cfg)
	if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), `"no-such-class"`) {
		t.Fatalf("Create with a missing StorageClass: %v, want ErrInvalidConfig naming it", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the refusal took %v: it waited, rather than reading why the Pod cannot be scheduled", d)
	}
	pods, err := cs.CoreV1().Pods(p.Namespace()).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("Pods left: %v, %v", pods, err)
	}
	// The claim is deleted at once; the API server keeps it, marked, until the
	// pvc-protection controller has seen its Pod go (a few seconds), so it is awaited.
	var claims *corev1.PersistentVolumeClaimList
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		claims, err = cs.CoreV1().PersistentVolumeClaims(p.Namespace()).List(ctx, metav1.ListOptions{})
		if err == nil && len(claims.Items) == 0 {
			break
		}
		if err == nil {
			for _, c := range claims.Items {
				if c.DeletionTimestamp == nil {
					t.Fatalf("a claim left, not even being deleted: %s", c.Name)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("claims left 30 s after the create failed: %v, %v", claims, err)
		}
	}
}

// sh runs a shell script in sandbox id (execOK).
func sh(t *testing.T, p *kubernetes.Provider, id, script string) string {
	t.Helper()
	return execOK(t, p, id, "sh", "-c", script)
}

// loopDevices lists the loop devices whose backing file is img.
func loopDevices(t *testing.T, img string) []string {
	t.Helper()
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		if strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == img {
			out = append(out, filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return out
}

// checkVolumeGone waits until the provisioner has given back a removed workspace's
// volume: the PersistentVolume, its image, its mount point and its loop device (which
// goes when the kubelet has unmounted the last Pod's bind mount).
func checkVolumeGone(t *testing.T, cs k8s.Interface, pv *corev1.PersistentVolume, img string) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(time.Minute); ; {
		left = nil
		if _, err := cs.CoreV1().PersistentVolumes().Get(context.Background(), pv.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("PersistentVolume %s (%v)", pv.Name, err))
		}
		for _, f := range []string{img, pv.Spec.Local.Path} {
			if _, err := os.Lstat(f); err == nil {
				left = append(left, f)
			}
		}
		if loops := loopDevices(t, img); len(loops) > 0 {
			left = append(left, "loop devices "+strings.Join(loops, ", "))
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("a minute after the workspace was removed, still there: %s", strings.Join(left, "; "))
	}
}
