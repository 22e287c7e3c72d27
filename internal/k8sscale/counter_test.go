package k8sscale

import "testing"

func TestRequestKey(t *testing.T) {
	for _, c := range []struct {
		method, path string
		watch        bool
		want         string
	}{
		{"POST", "/api/v1/namespaces/ns/pods", false, "create pods"},
		{"GET", "/api/v1/namespaces/ns/pods", false, "list pods"},
		{"GET", "/api/v1/namespaces/ns/pods", true, "watch pods"},
		{"GET", "/api/v1/namespaces/ns/pods/kubernetes-1", false, "get pods"},
		{"DELETE", "/api/v1/namespaces/ns/pods/kubernetes-1", false, "delete pods"},
		{"POST", "/api/v1/namespaces/ns/pods/kubernetes-1/exec", false, "create pods/exec"},
		{"PATCH", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/kubernetes-1", false, "patch networkpolicies"},
		{"GET", "/api/v1/namespaces/ns", false, "get namespaces"},
		{"POST", "/api/v1/namespaces", false, "create namespaces"},
		{"GET", "/version", false, "get /version"},
	} {
		if got := requestKey(c.method, c.path, c.watch); got != c.want {
			t.Errorf("%s %s: %q, want %q", c.method, c.path, got, c.want)
		}
	}
}
