package e2b_test

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/localca"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestTLS: with --tls-cert and --tls-key the listener is served over TLS, as --listen
// is, the printed URLs say https, and a plaintext request gets no API.
func TestTLS(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := t.TempDir()
	ca, err := localca.New("e2b test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Server([]string{"127.0.0.1"}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	if err := leaf.Write(cert, key); err != nil {
		t.Fatal(err)
	}
	s := serve(t, daemon.Config{TLSCert: cert, TLSKey: key})
	url := s.env["E2B_API_URL"]
	if !strings.HasPrefix(url, "https://127.0.0.1:") || s.env["E2B_SANDBOX_URL"] != url {
		t.Fatalf("roched printed %v, want https URLs", s.env)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest("GET", url+"/v2/sandboxes", nil)
	req.Header.Set("X-API-Key", s.env["E2B_API_KEY"])
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Errorf("list over TLS: %d, TLS %v", resp.StatusCode, resp.TLS != nil)
	}
	plain := "http://" + strings.TrimPrefix(url, "https://")
	req, _ = http.NewRequest("GET", plain+"/v2/sandboxes", nil)
	req.Header.Set("X-API-Key", s.env["E2B_API_KEY"])
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Errorf("a plaintext request was served")
		}
	}
}
