// Package localca makes a small certificate authority of roched's own, and the
// certificates it signs, with crypto/x509 alone (no openssl at run time): what `roche
// daemon start --tls` writes so that roched serves TLS without an operator's PKI, and what
// the tests use to make right, wrong and expired certificates.
package localca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// CA is a certificate authority: its certificate and the key that signs with it.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     crypto.Signer
}

// Validity of what Ensure makes: the CA long enough not to be a chore, the server
// certificate short enough that a leaked key does not stay useful for years (Ensure
// renews it when it nears its end).
const (
	CAValidity     = 10 * 365 * 24 * time.Hour
	ServerValidity = 397 * 24 * time.Hour
	renewBefore    = 30 * 24 * time.Hour
)

// New makes a CA named name, valid from now for validFor.
func New(name string, validFor time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Roche"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := sign(tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), Key: key}, nil
}

// Load reads a CA written by Write.
func Load(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", certFile)
	}
	b, _ := pem.Decode(keyPEM)
	if b == nil {
		return nil, fmt.Errorf("%s holds no PEM key", keyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: not a signing key", keyFile)
	}
	return &CA{Cert: cert, CertPEM: certPEM, Key: signer}, nil
}

// Write writes the CA's certificate (mode 0644) and key (mode 0600).
func (ca *CA) Write(certFile, keyFile string) error {
	keyPEM, err := keyBytes(ca.Key)
	if err != nil {
		return err
	}
	if err := WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	return WriteFile(certFile, ca.CertPEM, 0o644)
}

// Leaf is a certificate the CA signed, with its key, both PEM.
type Leaf struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
}

// Server signs a server certificate for hosts (IP addresses or DNS names), valid from
// notBefore to notAfter.
func (ca *CA) Server(hosts []string, notBefore, notAfter time.Time) (Leaf, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "roched"},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.leaf(tmpl)
}

// Client signs a client certificate whose Common Name is name (for roched, the tenant).
func (ca *CA) Client(name string, notBefore, notAfter time.Time) (Leaf, error) {
	return ca.leaf(&x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (ca *CA) leaf(tmpl *x509.Certificate) (Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, err
	}
	der, err := sign(tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return Leaf{}, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return Leaf{}, err
	}
	keyPEM, err := keyBytes(key)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: keyPEM, Cert: cert}, nil
}

// Write writes the certificate (mode 0644) and its key (mode 0600), the key first, each
// by a rename so that a reader never sees half a file.
func (l Leaf) Write(certFile, keyFile string) error {
	if err := WriteFile(keyFile, l.KeyPEM, 0o600); err != nil {
		return err
	}
	return WriteFile(certFile, l.CertPEM, 0o644)
}

func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
}

func keyBytes(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pemBlock("PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// ParseCert parses the first certificate of a PEM file.
func ParseCert(b []byte) (*x509.Certificate, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM certificate in it")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

// WriteFile writes b to path with mode perm through a temporary file in the same
// directory and a rename.
func WriteFile(path string, b []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// Paths are the files Ensure keeps in its directory.
type Paths struct {
	CA, CAKey, Cert, Key string
}

// PathsIn names the files of a local CA kept in dir.
func PathsIn(dir string) Paths {
	return Paths{
		CA: filepath.Join(dir, "ca.pem"), CAKey: filepath.Join(dir, "ca-key.pem"),
		Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem"),
	}
}

// EnsureCA keeps a local CA in dir (mode 0700, its key 0600): the one there, else a new
// one.
func EnsureCA(dir string) (Paths, error) {
	p := PathsIn(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return p, err
	}
	_, err := Load(p.CA, p.CAKey)
	if errors.Is(err, os.ErrNotExist) {
		var ca *CA
		ca, err = New("Roche local CA", CAValidity)
		if err == nil {
			err = ca.Write(p.CA, p.CAKey)
		}
	}
	if err != nil {
		return p, fmt.Errorf("the local CA in %s: %w (remove the directory to make a new one)", dir, err)
	}
	return p, nil
}

// Ensure keeps a local CA and a server certificate for hosts in dir (mode 0700, keys
// 0600): the CA made once and kept, so that clients that trust it keep trusting it; the
// server certificate made anew when it is missing, does not name every host, or ends
// within 30 days (roched reloads it without a restart). It says whether it wrote a new
// server certificate.
func Ensure(dir string, hosts []string) (Paths, bool, error) {
	p, err := EnsureCA(dir)
	if err != nil {
		return p, false, err
	}
	ca, err := Load(p.CA, p.CAKey)
	if err != nil {
		return p, false, err
	}
	if covers(p, ca, hosts) {
		return p, false, nil
	}
	now := time.Now()
	leaf, err := ca.Server(hosts, now.Add(-time.Minute), now.Add(ServerValidity))
	if err == nil {
		err = leaf.Write(p.Cert, p.Key)
	}
	if err != nil {
		return p, false, fmt.Errorf("the server certificate in %s: %w", dir, err)
	}
	return p, true, nil
}

// covers reports whether the server certificate in p was signed by ca, names every host
// and is not near its end.
func covers(p Paths, ca *CA, hosts []string) bool {
	b, err := os.ReadFile(p.Cert)
	if err != nil {
		return false
	}
	if _, err := os.Stat(p.Key); err != nil {
		return false
	}
	cert, err := ParseCert(b)
	if err != nil || cert.CheckSignatureFrom(ca.Cert) != nil || time.Until(cert.NotAfter) < renewBefore {
		return false
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
				return false
			}
		} else if !slices.Contains(cert.DNSNames, h) {
			return false
		}
	}
	return bytes.Equal(cert.RawIssuer, ca.Cert.RawSubject)
}
