package localca

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestEnsure: the first call makes a CA and a server certificate it signs for the hosts,
// keys mode 0600 in a 0700 directory; a second keeps both; a new host renews the server
// certificate under the same CA; the certificate verifies against the CA for its hosts.
func TestEnsure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	p, made, err := Ensure(dir, []string{"127.0.0.1", "localhost"})
	if err != nil || !made {
		t.Fatalf("first Ensure: %v %v", made, err)
	}
	for f, mode := range map[string]os.FileMode{dir: 0o700, p.CAKey: 0o600, p.Key: 0o600, p.CA: 0o644, p.Cert: 0o644} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want %04o", f, fi, err, mode)
		}
	}
	ca1, _ := os.ReadFile(p.CA)
	cert1, _ := os.ReadFile(p.Cert)
	if _, made, err := Ensure(dir, []string{"localhost", "127.0.0.1"}); err != nil || made {
		t.Fatalf("second Ensure made a new certificate: %v %v", made, err)
	}
	if _, made, err := Ensure(dir, []string{"127.0.0.1", "localhost", "10.1.2.3"}); err != nil || !made {
		t.Fatalf("a new host: %v %v, want a new certificate", made, err)
	}
	ca2, _ := os.ReadFile(p.CA)
	cert2, _ := os.ReadFile(p.Cert)
	if !bytes.Equal(ca1, ca2) || bytes.Equal(cert1, cert2) {
		t.Fatal("want the CA kept and the certificate renewed")
	}
	ca, err := ParseCert(ca2)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ParseCert(cert2)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, h := range []string{"127.0.0.1", "localhost", "10.1.2.3"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: h}); err != nil {
			t.Errorf("the certificate for %s: %v", h, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "other.example"}); err == nil {
		t.Error("the certificate verifies for a host it does not name")
	}
	if time.Until(leaf.NotAfter) < ServerValidity-time.Hour {
		t.Errorf("the certificate ends at %v", leaf.NotAfter)
	}
}

// TestClientCertificate: a client certificate names its tenant, is for client auth only,
// and verifies against its CA and not another.
func TestClientCertificate(t *testing.T) {
	ca, err := New("a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := New("b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ca.Client("acme", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if l.Cert.Subject.CommonName != "acme" || len(l.Cert.ExtKeyUsage) != 1 || l.Cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Fatalf("client certificate %+v", l.Cert.Subject)
	}
	for name, c := range map[string]*CA{"its CA": ca, "another": other} {
		roots := x509.NewCertPool()
		roots.AddCert(c.Cert)
		_, err := l.Cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if (err == nil) != (c == ca) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
