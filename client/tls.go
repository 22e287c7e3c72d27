package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche"
)

// WithCAFile trusts the CA certificates in a PEM file, instead of the system's, for a
// daemon at an https:// address (roched --tls-cert; roche daemon start --tls writes such
// a CA and prints its path).
func WithCAFile(path string) Option { return func(o *options) { o.caFile = path } }

// WithClientCert presents the certificate and key in these PEM files to a daemon that
// requires client certificates (roched --client-ca).
func WithClientCert(certFile, keyFile string) Option {
	return func(o *options) { o.clientCert, o.clientKey = certFile, keyFile }
}

// WithTLSConfig uses cfg for an https:// address, as it is; WithCAFile and
// WithClientCert add to it.
func WithTLSConfig(cfg *tls.Config) Option { return func(o *options) { o.tlsConfig = cfg } }

// tlsConfig builds the client's TLS settings from the options; nil means Go's defaults.
func (o *options) tlsSettings() (*tls.Config, error) {
	if o.tlsConfig == nil && o.caFile == "" && o.clientCert == "" && o.clientKey == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.tlsConfig != nil {
		cfg = o.tlsConfig.Clone()
	}
	if o.caFile != "" {
		b, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: reading the CA file: %v", roche.ErrInvalidConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%w: CA file %s holds no PEM certificate", roche.ErrInvalidConfig, o.caFile)
		}
		cfg.RootCAs = pool
	}
	if (o.clientCert == "") != (o.clientKey == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both its certificate and its key file", roche.ErrInvalidConfig)
	}
	if o.clientCert != "" {
		pair, err := tls.LoadX509KeyPair(o.clientCert, o.clientKey)
		if err != nil {
			return nil, fmt.Errorf("%w: client certificate %s and key %s: %v", roche.ErrInvalidConfig, o.clientCert, o.clientKey, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// tlsProblem says in one line why a TLS connection to the daemon failed, and what to
// do, or returns "" when err is not about TLS.
func tlsProblem(where string, err error) string {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var op *net.OpError
	var record tls.RecordHeaderError
	switch {
	case errors.As(err, &unknown):
		return fmt.Sprintf("roched at %s presented a certificate signed by an authority this client does not trust (%s): give the CA that signed it with --ca FILE or ROCHE_CA_FILE",
			where, subjectOf(unknown.Cert))
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		c := invalid.Cert
		if c != nil && time.Now().Before(c.NotBefore) {
			return fmt.Sprintf("roched at %s presented a certificate not valid until %s (check this host's clock)", where, c.NotBefore.UTC().Format(time.RFC3339))
		}
		at := ""
		if c != nil {
			at = " at " + c.NotAfter.UTC().Format(time.RFC3339)
		}
		return fmt.Sprintf("roched at %s presented a certificate that expired%s: renew its --tls-cert (roched reloads it without a restart)", where, at)
	case errors.As(err, &invalid):
		return fmt.Sprintf("roched at %s presented a certificate this client refuses: %v", where, invalid)
	case errors.As(err, &host):
		return fmt.Sprintf("roched at %s presented a certificate for other names (%v): use an address it names, or reissue it", where, host.Error())
	case errors.As(err, &op) && op.Op == "remote error" && !strings.Contains(op.Err.Error(), "certificate"):
		return fmt.Sprintf("roched at %s ended the TLS handshake: %v", where, op.Err)
	case errors.As(err, &op) && op.Op == "remote error":
		// The server ended the handshake: with --client-ca, a missing or untrusted
		// client certificate.
		return fmt.Sprintf("roched at %s refused this client's TLS handshake (%v): it requires a client certificate signed by its --client-ca; give one with --client-cert and --client-key (ROCHE_CLIENT_CERT, ROCHE_CLIENT_KEY)",
			where, op.Err)
	case errors.As(err, &record):
		return fmt.Sprintf("roched at %s does not speak TLS: use an http:// address, or give roched --tls-cert and --tls-key", where)
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Sprintf("roched at %s does not speak TLS: use an http:// address, or give roched --tls-cert and --tls-key", where)
	case strings.HasPrefix(where, "https://") && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)):
		// TLS 1.3 ends the handshake before the server has checked the client's
		// certificate, so a refused one may show only as the connection closing.
		return fmt.Sprintf("roched at %s closed the TLS connection: if it requires a client certificate (--client-ca), give one signed by that CA with --client-cert and --client-key (ROCHE_CLIENT_CERT, ROCHE_CLIENT_KEY); else check that it is running", where)
	case strings.Contains(err.Error(), "tls: "):
		return fmt.Sprintf("TLS with roched at %s failed: %v", where, err)
	}
	return ""
}

func subjectOf(c *x509.Certificate) string {
	if c == nil {
		return "no certificate"
	}
	return "issued by " + c.Issuer.String()
}
