package kubernetes_test

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest/podlink"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kubernetes"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// podPIDs returns the host's pids of a sandbox's processes: the test cluster's node is
// this host, and each process of a Pod is in a cgroup named after the Pod's UID.
func podPIDs(cs k8s.Interface, ns string) func(id string) ([]int, error) {
	return func(id string) ([]int, error) {
		pod, err := cs.CoreV1().Pods(ns).Get(context.Background(), id, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		uid := string(pod.UID)
		marks := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
		procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
		var pids []int
		for _, f := range procs {
			b, err := os.ReadFile(f)
			if err != nil || !(strings.Contains(string(b), marks[0]) || strings.Contains(string(b), marks[1])) {
				continue
			}
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, pid)
		}
		if len(pids) == 0 {
			return nil, fmt.Errorf("no process on this host is in a cgroup of Pod %s (uid %s)", id, uid)
		}
		return pids, nil
	}
}

// TestEgressInterceptAndSecrets: the conformance check of interception and secrets (also
// in TestConformance), and, from the API server, that the Pod and its CA's ConfigMap hold
// the certificate and the placeholder, never the secret's value nor a private key, and
// that the ConfigMap goes with its sandbox.
func TestEgressInterceptAndSecrets(t *testing.T) {
	testenv.Needs(t, testenv.Cluster, testenv.Root)
	p := newProvider(t, kubernetes.WithEgressProxy())
	cs := clientset(t)
	ns := p.Namespace()
	id, value := providertest.EgressIntercept(t, p, baseConfig(), func(cfg roche.Config) string { return create(t, p, cfg).ID }, podPIDs(cs, ns))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the sandbox's CA ConfigMap: %v", err)
	}
	if len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].UID != pod.UID {
		t.Errorf("the CA's ConfigMap is not tied to its Pod: %+v", cm.OwnerReferences)
	}
	stored := fmt.Sprintf("%+v %+v", pod, cm)
	if !strings.Contains(stored, "API_TOKEN roche-secret-") && !strings.Contains(stored, "Value:roche-secret-") {
		t.Error("the Pod lacks the placeholder: the check below looked at the wrong thing")
	}
	if !strings.Contains(stored, "BEGIN CERTIFICATE") {
		t.Error("the ConfigMap lacks the CA's certificate")
	}
	if strings.Contains(stored, value) || strings.Contains(stored, "PRIVATE KEY") {
		t.Error("the Pod or its ConfigMap holds the secret or a private key")
	}
	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the CA's ConfigMap outlived its sandbox: %v", err)
	}
	if egress.Lookup(id) != nil {
		t.Error("the sandbox's egress proxy outlived it")
	}
}

// TestEgressTrustOutOfReach: a root sandbox cannot touch its trust files (its
// ConfigMap's keys, bound read-only by subPath); the host keeps nothing in the Pod. The
// socket directory also holds the kubelet's termination-log (podlink.TerminationLog),
// bound there by the kubelet (so it cannot be replaced by a symlink) and read by it
// with a bound.
func TestEgressTrustOutOfReach(t *testing.T) {
	testenv.Needs(t, testenv.Cluster, testenv.Root)
	p := newProvider(t, kubernetes.WithEgressProxy())
	providertest.EgressTrustOutOfReach(t, p, baseConfig(), func(cfg roche.Config) string { return create(t, p, cfg).ID },
		path.Base(podlink.TerminationLog))
}
