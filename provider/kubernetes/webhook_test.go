package kubernetes_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// rewriter is a mutating admission webhook that rewrites the Pods of one namespace on
// their way into the cluster with the JSON patch it is given, as a cluster's policy
// engine might.
type rewriter struct {
	mu    sync.Mutex
	patch string
	seen  int
}

func (rw *rewriter) set(patch string) {
	rw.mu.Lock()
	rw.patch = patch
	rw.mu.Unlock()
}

func (rw *rewriter) calls() int {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.seen
}

func (rw *rewriter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	rw.mu.Lock()
	rw.seen++
	patch := rw.patch
	rw.mu.Unlock()
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	if patch != "" && (review.Request.DryRun == nil || !*review.Request.DryRun) {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = []byte(patch), &pt
	}
	review.Request, review.Response = nil, resp
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(review)
}

// serveWebhook serves rw over TLS on loopback, with a certificate of its own for
// 127.0.0.1, and returns its URL and the certificate (the webhook's CA bundle).
func serveWebhook(t *testing.T, rw http.Handler) (string, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "roche-test-webhook"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rw, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12,
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.ServeTLS(ln, "", "")
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "https://" + ln.Addr().String() + "/mutate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestPostureRewrittenOnTheWayIn: a mutating admission webhook that takes the asked-for
// RuntimeClass off the sandbox's Pod, or puts its container under the runtime's default
// seccomp profile, does not get a sandbox run with less isolation than asked: the create
// fails saying so and the Pod is gone; so does one that drops a gVisor Pod's mount hint.
// With the webhook passing Pods through unchanged, the same create succeeds.
func TestPostureRewrittenOnTheWayIn(t *testing.T) {
	rc := runtimeClass(t, "runc")
	p := newProvider(t, kubernetes.WithRuntimeClass(rc))
	cs := clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace()}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	rw := &rewriter{}
	url, ca := serveWebhook(t, rw)
	name := "roche-test-" + strings.TrimPrefix(p.Namespace(), "roche-test-")
	none, fail := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Fail
	scope := admissionregistrationv1.NamespacedScope
	timeout := int32(10)
	// Only the test's own namespace's Pods go through it.
	if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         "posture.roche-test.invalid",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: &scope},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": p.Namespace()}},
			SideEffects:             &none,
			FailurePolicy:           &fail,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	// The API server takes the new webhook up within a few seconds: dry-run Pods until
	// one reaches it (a dry run is not patched, and makes nothing).
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-probe"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "roche/none:none"}}},
	}
	for rw.calls() == 0 {
		_, _ = cs.CoreV1().Pods(p.Namespace()).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		select {
		case <-ctx.Done():
			t.Fatal("the API server never called the webhook")
		case <-time.After(200 * time.Millisecond):
		}
	}

	for _, c := range []struct{ what, patch, want string }{
		{"RuntimeClass taken off", `[{"op":"remove","path":"/spec/runtimeClassName"}]`, "runtime class"},
		{"runtime's default seccomp", `[{"op":"replace","path":"/spec/containers/0/securityContext/seccompProfile","value":{"type":"RuntimeDefault"}}]`, "seccomp RuntimeDefault"},
	} {
		rw.set(c.patch)
		before := rw.calls()
		_, err := p.Create(ctx, baseConfig())
		if rw.calls() == before {
			t.Fatalf("%s: the webhook was not called", c.what)
		}
		if !errors.Is(err, roche.ErrUnavailable) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Create: %v, want one line wrapping ErrUnavailable naming the %s", c.what, err, c.want)
		}
		t.Logf("%s: %v", c.what, err)
		noPods(t, p)
	}
	// On gVisor Pods, the mount hints that size /tmp and /dev/shm: one dropped would leave
	// /dev/shm at gVisor's own size. (A provider of the gVisor class, in the same
	// namespace, whose Pods the webhook rewrites.)
	pg, err := kubernetes.New(kubernetes.WithKubeconfig(testcluster.Kubeconfig(t)), kubernetes.WithNamespace(p.Namespace()),
		kubernetes.WithRuntimeClass(testcluster.RuntimeClassGVisor))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	rw.set(`[{"op":"remove","path":"/metadata/annotations/dev.gvisor.spec.mount.shm.options"}]`)
	before := rw.calls()
	_, err = pg.Create(ctx, baseConfig())
	if rw.calls() == before {
		t.Fatal("gVisor's mount hint dropped: the webhook was not called")
	}
	if !errors.Is(err, roche.ErrUnavailable) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "annotation dev.gvisor.spec.mount.shm.options") {
		t.Errorf("gVisor's mount hint dropped: Create: %v, want one line wrapping ErrUnavailable naming the annotation", err)
	}
	t.Logf("gVisor's mount hint dropped: %v", err)
	noPods(t, p)

	rw.set("")
	sb := create(t, p, baseConfig())
	if got := py(t, p, sb.ID, "print('ran')"); got != "ran" {
		t.Fatalf("with the Pod unchanged: %q", got)
	}
}
