package k8sscale

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestMain lets the test binary be the scale run's roched (roched.go).
func TestMain(m *testing.M) {
	RunIfChild()
	os.Exit(m.Run())
}

// TestScale runs the scale scenario small on the test cluster's kwok nodes: every
// sandbox of the pool claimed and listed, the expiring ones reaped, roched killed with
// SIGKILL and started again finding the kept ones and destroying the idle ones, and
// nothing left in the test's namespace.
func TestScale(t *testing.T) {
	testenv.Needs(t, testenv.Cluster)
	runSmall(t, Params{Sandboxes: 50, Expiring: 10, ExpireAfter: 8 * time.Second, Clients: 8, PoolConcurrency: 8})
}

// TestScaleReplicas is TestScale through 3 roched of one replica group, each filling a
// pool of its third and claimed from by its share of the clients: every replica lists
// all the claims, the leader reaps the expired ones whichever replica gave them out, and
// the first replica killed with SIGKILL and started again destroys only its own idle
// sandboxes, not the others'.
func TestScaleReplicas(t *testing.T) {
	testenv.Needs(t, testenv.Cluster)
	runSmall(t, Params{Sandboxes: 48, Expiring: 9, ExpireAfter: 8 * time.Second, Clients: 6, PoolConcurrency: 8, Replicas: 3, KubeQPS: 100})
}

func runSmall(t *testing.T, p Params) {
	cluster, err := testcluster.StartKwok(2)
	if err != nil {
		t.Fatal(err)
	}
	ns := "roche-scale-" + randomHex(4)
	cs, err := adminClient(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p.Kubeconfig, p.Namespace, p.Selector = cluster.Kubeconfig, ns, testcluster.KwokSelector
	p.Dir, p.Progress = testenv.ShortDir(t), testWriter{t}
	res, err := Run(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	n, exp, nr := p.Sandboxes, p.Expiring, max(1, p.Replicas)
	// The first roched's share of the expiring claims (sandbox i is claimed from i%nr).
	first := 0
	for i := n - exp; i < n; i++ {
		if i%nr == 0 {
			first++
		}
	}
	if len(res.Claims) != n || len(res.Reaps) != exp || res.Kept != n-exp || res.Leftovers != first {
		t.Fatalf("claims %d, reaps %d, kept %d, leftovers %d: want %d, %d, %d, %d", len(res.Claims), len(res.Reaps), res.Kept, res.Leftovers, n, exp, n-exp, first)
	}
	if len(res.ReplicaRSSKiB) != nr {
		t.Errorf("memory of %d roched, want %d", len(res.ReplicaRSSKiB), nr)
	}
	// The reaper looks every second; a destroy is a few requests.
	if worst := slices.Max(res.Reaps); worst > 15*time.Second {
		t.Errorf("a sandbox was reaped %v after its expiry", worst)
	}
	// roched asks for plain answers: a list of the run's Pods is over the 128 KiB past
	// which the API server would gzip it.
	if res.Gzipped != 0 {
		t.Errorf("%d of roched's answers from the API server came gzipped", res.Gzipped)
	}
	for phase, c := range res.Requests {
		t.Logf("requests in %s: %d (%s)", phase, c.Total(), c)
	}
	t.Logf("fill %v, claim p50 %v, list %v, restart ready %v, clean %v, RSS %v KiB",
		res.Fill, median(res.Claims), median(res.Lists), res.RestartReady, res.RestartClean, res.ReplicaRSSKiB)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
