package daemon

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/localca"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// pki is a test's certificates: a CA, a server certificate it signed for 127.0.0.1,
// written where roched reads them.
type pki struct {
	ca             *localca.CA
	dir            string
	caFile         string
	cert, key      string
	serverLeafCert *x509.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := localca.New("test CA "+randomName(""), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := &pki{ca: ca, dir: dir, caFile: filepath.Join(dir, "ca.pem"), cert: filepath.Join(dir, "server.pem"), key: filepath.Join(dir, "server-key.pem")}
	if err := localca.WriteFile(p.caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	p.serverLeafCert = p.issueServer(t, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	return p
}

// issueServer writes a new server certificate valid from nb to na over the old one.
func (p *pki) issueServer(t *testing.T, nb, na time.Time) *x509.Certificate {
	t.Helper()
	leaf, err := p.ca.Server([]string{"127.0.0.1", "localhost"}, nb, na)
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.Write(p.cert, p.key); err != nil {
		t.Fatal(err)
	}
	return leaf.Cert
}

// clientCert writes a client certificate for name signed by the pki's CA.
func (p *pki) clientCert(t *testing.T, name string) (string, string) {
	t.Helper()
	leaf, err := p.ca.Client(name, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	c, k := filepath.Join(p.dir, name+"-client.pem"), filepath.Join(p.dir, name+"-client-key.pem")
	if err := leaf.Write(c, k); err != nil {
		t.Fatal(err)
	}
	return c, k
}

// startTLSDaemon starts a daemon in-process serving TCP over TLS on loopback with the
// tenants names, logging to logs.
func startTLSDaemon(t *testing.T, p *pki, clientCA string, names []string) *tenantDaemon {
	t.Helper()
	td := startTenantDaemon(t, Config{TLSCert: p.cert, TLSKey: p.key, ClientCA: clientCA}, names, nil)
	td.addr = "https://" + td.d.TCPAddr().String()
	return td
}

// oneLine fails the test unless err is a single line holding every want.
func oneLine(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("%s: the error is not one line: %q", what, msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: %q does not say %q", what, msg, w)
		}
	}
}

// TestTLSVerifies: a client that trusts the daemon's CA is served; one that trusts
// another CA, or only the system's, is refused with one line saying to give the CA; a
// certificate that expired is refused with one line naming the expiry; a plaintext
// client and an https client on a plaintext daemon are told which side lacks TLS.
func TestTLSVerifies(t *testing.T) {
	p := newPKI(t)
	td := startTLSDaemon(t, p, "", []string{"acme"})
	ctx := ctxFor(t, time.Minute)
	good, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["acme"]), client.WithCAFile(p.caFile))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if _, err := good.Providers(ctx); err != nil {
		t.Fatalf("a client trusting the CA: %v", err)
	}
	if h, err := good.Health(ctx); err != nil || h.PID != os.Getpid() {
		t.Fatalf("/healthz over TLS: %+v %v", h, err)
	}

	other := newPKI(t)
	for name, opts := range map[string][]client.Option{
		"another CA":      {client.WithCAFile(other.caFile)},
		"the system's CA": nil,
	} {
		c, err := client.New(append(opts, client.WithAddress(td.addr), client.WithToken(td.tokens["acme"]))...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Providers(ctx)
		oneLine(t, name, err, "does not trust", "ROCHE_CA_FILE")
		if !errors.Is(err, roche.ErrUnavailable) {
			t.Errorf("%s: %v is not ErrUnavailable", name, err)
		}
		_, err = c.Health(ctx)
		oneLine(t, name+", /healthz", err, "does not trust")
		c.Close()
	}

	// Plain HTTP to the TLS port gets no API: Go's server answers 400 to it.
	plain, err := client.New(client.WithAddress("http://"+td.d.TCPAddr().String()), client.WithToken(td.tokens["acme"]))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Providers(ctx); err == nil {
		t.Fatal("plaintext HTTP to the TLS listener was served")
	}
	plain.Close()
	resp, err := http.Get("http://" + td.d.TCPAddr().String() + "/metrics")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || bytes.Contains(b, []byte("roche_")) {
			t.Fatalf("/metrics over plaintext on the TLS listener: %s %s", resp.Status, b)
		}
	}

	// Expired: the daemon serves it (with a warning), clients refuse it naming the expiry.
	expired := p.issueServer(t, time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour))
	c, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["acme"]), client.WithCAFile(p.caFile))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Providers(ctx)
	oneLine(t, "an expired certificate", err, "expired at "+expired.NotAfter.UTC().Format(time.RFC3339), "renew")
	c.Close()
	if !strings.Contains(td.logs.String(), "not valid now") {
		t.Errorf("roched did not warn of the expired certificate:\n%s", td.logs)
	}

	// An https client on a plaintext daemon is told the daemon has no TLS.
	pt := startTenantDaemon(t, Config{}, []string{"acme"}, nil)
	c, err = client.New(client.WithAddress("https://"+pt.d.TCPAddr().String()), client.WithToken(pt.tokens["acme"]), client.WithCAFile(p.caFile))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Providers(ctx)
	oneLine(t, "https to a plaintext daemon", err, "does not speak TLS")
	c.Close()
}

// TestTLSClientCertificates: with --client-ca, a client without a certificate, or with
// one from another CA, is refused at the handshake; one with the CA's certificate is
// served as the tenant its Common Name names, with no token or with that tenant's
// token; with another tenant's token it is refused, naming both.
func TestTLSClientCertificates(t *testing.T) {
	p := newPKI(t)
	clients := newPKI(t)
	td := startTLSDaemon(t, p, clients.caFile, []string{"acme", "bolt"})
	ctx := ctxFor(t, 2*time.Minute)
	acmeCert, acmeKey := clients.clientCert(t, "acme")
	wrong := newPKI(t)
	wrongCert, wrongKey := wrong.clientCert(t, "acme")
	for name, opts := range map[string][]client.Option{
		"no client certificate":         nil,
		"a certificate from another CA": {client.WithClientCert(wrongCert, wrongKey)},
	} {
		c, err := client.New(append(opts, client.WithAddress(td.addr), client.WithToken(td.tokens["acme"]), client.WithCAFile(p.caFile))...)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Providers(ctx)
		oneLine(t, name, err, "TLS", "--client-cert")
		c.Close()
	}

	for name, tok := range map[string]string{"no token": "", "acme's token": td.tokens["acme"]} {
		c, err := client.New(client.WithAddress(td.addr), client.WithToken(tok), client.WithCAFile(p.caFile), client.WithClientCert(acmeCert, acmeKey))
		if err != nil {
			t.Fatal(err)
		}
		pr := c.Provider("docker")
		sb, err := pr.Create(ctx, pyConfig())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !strings.HasSuffix(sb.Owner, "/acme") {
			t.Errorf("%s: owner %q, want the tenant acme", name, sb.Owner)
		}
		if err := pr.Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}

	c, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["bolt"]), client.WithCAFile(p.caFile), client.WithClientCert(acmeCert, acmeKey))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Providers(ctx)
	oneLine(t, "acme's certificate with bolt's token", err, `names tenant "acme" but the bearer token tenant "bolt"`)
	if !errors.Is(err, roche.ErrPermission) && !strings.Contains(err.Error(), "bearer token") {
		t.Errorf("%v", err)
	}
	c.Close()

	// A certificate for a tenant no file lists is that tenant, apart from the others.
	zedCert, zedKey := clients.clientCert(t, "zed")
	c, err = client.New(client.WithAddress(td.addr), client.WithCAFile(p.caFile), client.WithClientCert(zedCert, zedKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if list, err := c.Provider("docker").List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("zed's list: %v %v", list, err)
	}
	badCert, badKey := clients.clientCert(t, "local")
	c2, _ := client.New(client.WithAddress(td.addr), client.WithCAFile(p.caFile), client.WithClientCert(badCert, badKey))
	defer c2.Close()
	_, err = c2.Providers(ctx)
	oneLine(t, "a certificate named local", err, "not a tenant name")
}

// serialSeen is a client TLS config that records the serial of every server
// certificate it verifies, one per handshake.
type serialSeen struct {
	mu      sync.Mutex
	serials []string
}

func (s *serialSeen) config(caFile string, t *testing.T) *tls.Config {
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return &tls.Config{RootCAs: pool, VerifyConnection: func(cs tls.ConnectionState) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.serials = append(s.serials, cs.PeerCertificates[0].SerialNumber.Text(16))
		return nil
	}}
}

func (s *serialSeen) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.serials...)
}

// TestTLSRotation: replacing the certificate and key files serves the new certificate
// to the next connection without a restart, while a connection opened before keeps
// working (on the old one, without a new handshake); a broken new pair is refused with
// a log line and the certificate in use stays.
func TestTLSRotation(t *testing.T) {
	p := newPKI(t)
	td := startTLSDaemon(t, p, "", []string{"acme"})
	ctx := ctxFor(t, time.Minute)
	first := p.serverLeafCert.SerialNumber.Text(16)

	var old serialSeen
	oldClient, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["acme"]), client.WithTLSConfig(old.config(p.caFile, t)))
	if err != nil {
		t.Fatal(err)
	}
	defer oldClient.Close()
	if _, err := oldClient.Providers(ctx); err != nil {
		t.Fatal(err)
	}
	if got := old.all(); len(got) != 1 || got[0] != first {
		t.Fatalf("first handshake saw %v, want [%s]", got, first)
	}

	second := p.issueServer(t, time.Now().Add(-time.Minute), time.Now().Add(time.Hour)).SerialNumber.Text(16)
	var fresh serialSeen
	newClient, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["acme"]), client.WithTLSConfig(fresh.config(p.caFile, t)))
	if err != nil {
		t.Fatal(err)
	}
	defer newClient.Close()
	if _, err := newClient.Providers(ctx); err != nil {
		t.Fatal(err)
	}
	if got := fresh.all(); len(got) != 1 || got[0] != second {
		t.Fatalf("a connection after the rotation saw %v, want the new serial %s (the old was %s)", got, second, first)
	}
	// The old connection is still open and serves, without a new handshake.
	for range 3 {
		if _, err := oldClient.Providers(ctx); err != nil {
			t.Fatalf("the connection opened before the rotation: %v", err)
		}
	}
	if got := old.all(); len(got) != 1 {
		t.Fatalf("the old client made new handshakes: %v", got)
	}
	if !strings.Contains(td.logs.String(), "TLS certificate reloaded") {
		t.Errorf("no reload logged:\n%s", td.logs)
	}

	// A certificate whose key does not match (the key file not yet replaced, say) is
	// not used: the next connection still gets the second certificate, and the log says why.
	other := newPKI(t)
	b, err := os.ReadFile(other.cert)
	if err != nil {
		t.Fatal(err)
	}
	if err := localca.WriteFile(p.cert, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var third serialSeen
	c3, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["acme"]), client.WithTLSConfig(third.config(p.caFile, t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := c3.Providers(ctx); err != nil {
		t.Fatalf("after a bad new certificate: %v", err)
	}
	if got := third.all(); len(got) != 1 || got[0] != second {
		t.Fatalf("after a bad new certificate a connection saw %v, want the one in use, %s", got, second)
	}
	if logs := td.logs.String(); !strings.Contains(logs, "do not load") || !strings.Contains(logs, "private key does not match") {
		t.Errorf("the bad pair was not logged with its reason:\n%s", logs)
	}
}

// rochedRefuses runs roched (this test binary as it) with args, expecting it to refuse to
// start: it fails the test when roched is still running after a minute (it was not
// refused, and is then killed), and returns its stderr otherwise.
func rochedRefuses(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "ROCHED_TEST_AS_DAEMON=1")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("roched %v was not refused: it ran until killed\n%s", args, errb.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("roched %v: %v, want exit status 1\n%s", args, err, errb.String())
	}
	return strings.TrimSpace(errb.String())
}

// TestPlaintextOffLoopbackRefused: plaintext TCP on an address that is not loopback
// (0.0.0.0, every address; :PORT) is refused in one line naming the three ways out;
// --insecure allows it; loopback addresses stay allowed; TLS settings are checked.
func TestPlaintextOffLoopbackRefused(t *testing.T) {
	dir := shortDir(t)
	tokFile := filepath.Join(dir, "token")
	writeToken(t, tokFile)
	sock := filepath.Join(dir, "r.sock")
	for _, listen := range []string{"tcp://0.0.0.0:0", "tcp://:0", "tcp://[::]:0"} {
		msg := rochedRefuses(t, "--socket", sock, "--providers", "docker", "--listen", listen, "--token-file", tokFile)
		if strings.Count(msg, "\n") != 0 {
			t.Fatalf("%s: %q: want a one-line refusal", listen, msg)
		}
		for _, w := range []string{"refusing plaintext TCP", "--tls-cert FILE and --tls-key FILE", "roche daemon start --tls", "--insecure"} {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q does not say %q", listen, msg, w)
			}
		}
	}
	p := newPKI(t)
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Listen: "tcp://0.0.0.0:7878", Token: randomToken()}, "refusing plaintext TCP"},
		{Config{Listen: "tcp://0.0.0.0:7878", Token: randomToken(), Insecure: true}, ""},
		{Config{Listen: "tcp://0.0.0.0:7878", Token: randomToken(), TLSCert: p.cert, TLSKey: p.key}, ""},
		{Config{Listen: "tcp://127.0.0.1:7878", Token: randomToken()}, ""},
		{Config{Listen: "tcp://127.8.9.10:7878", Token: randomToken()}, ""},
		{Config{Listen: "tcp://[::1]:7878", Token: randomToken()}, ""},
		{Config{Listen: "tcp://localhost:7878", Token: randomToken()}, ""},
		{Config{Listen: "tcp://127.0.0.1:7878", Token: randomToken(), TLSCert: p.cert}, "give both --tls-cert FILE and --tls-key FILE"},
		{Config{Listen: "tcp://127.0.0.1:7878", Token: randomToken(), ClientCA: p.caFile}, "--client-ca needs TLS"},
		{Config{Listen: "tcp://127.0.0.1:7878", TLSCert: p.cert, TLSKey: p.key, ClientCA: p.caFile}, ""},
	} {
		err := c.cfg.Validate([]string{"docker"})
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}

	// A key every local user can read is refused at start.
	if err := os.Chmod(p.key, 0o644); err != nil {
		t.Fatal(err)
	}
	msg := rochedRefuses(t, "--socket", sock, "--listen", "tcp://127.0.0.1:0", "--token-file", tokFile, "--tls-cert", p.cert, "--tls-key", p.key, "--providers", "docker")
	if !strings.Contains(msg, "open to others (mode 0644)") || !strings.Contains(msg, "chmod 600") {
		t.Fatalf("a world-readable key: %q", msg)
	}
}

// capture runs tcpdump on lo for one TCP port, writing a pcap file, until stop.
type capture struct {
	cmd  *exec.Cmd
	file string
}

func startCapture(t *testing.T, port string) *capture {
	t.Helper()
	bin, err := exec.LookPath("tcpdump")
	if err != nil {
		t.Fatal("tcpdump is not installed (scripts/test.sh installs it)")
	}
	c := &capture{file: filepath.Join(t.TempDir(), "lo.pcap")}
	// -U writes each packet as it comes, -Z root keeps the right to write the file.
	c.cmd = exec.Command(bin, "-i", "lo", "-n", "-U", "-s", "0", "-Z", "root", "-w", c.file, "tcp port "+port)
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var seen []string
		for sc.Scan() {
			seen = append(seen, sc.Text())
			if strings.Contains(sc.Text(), "listening on lo") {
				ready <- ""
				io.Copy(io.Discard, stderr)
				return
			}
		}
		ready <- strings.Join(seen, "\n")
	}()
	select {
	case out := <-ready:
		if out != "" {
			t.Fatalf("tcpdump did not start:\n%s", out)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tcpdump did not say it was listening within 30 s")
	}
	return c
}

// stop ends the capture once a marker sent to the port after the calls is in the file
// (so every packet of the calls is), and returns what was captured.
func (c *capture) stop(t *testing.T, addr string) []byte {
	t.Helper()
	marker := []byte("roche-capture-end-" + randomToken())
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conn.Write(marker)
	conn.Close()
	var b []byte
	eventually(t, 30*time.Second, "the marker in the capture", func() bool {
		b, _ = os.ReadFile(c.file)
		return bytes.Contains(b, marker)
	})
	c.cmd.Process.Signal(syscall.SIGINT)
	c.cmd.Wait()
	b, err = os.ReadFile(c.file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// authenticatedCalls makes calls that carry the token: a create, an exec whose output
// is known, a destroy, a list.
func authenticatedCalls(t *testing.T, c *client.Client, secret string) {
	t.Helper()
	ctx := ctxFor(t, 2*time.Minute)
	pr := c.Provider("docker")
	sb, err := pr.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	res, err := pr.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"echo", secret}})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != secret {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if err := pr.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pr.List(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTLSCaptureShowsNoToken captures loopback traffic to the daemon's port while a
// client makes authenticated calls. Over plaintext (the control) the token and a
// command's output are in the capture; over TLS neither is, while the capture holds
// the TLS records that carried them.
func TestTLSCaptureShowsNoToken(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.Tcpdump)
	p := newPKI(t)
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			cfg := Config{}
			if useTLS {
				cfg.TLSCert, cfg.TLSKey = p.cert, p.key
			}
			td := startTenantDaemon(t, cfg, []string{"acme"}, nil)
			addr := td.d.TCPAddr().String()
			_, port, _ := net.SplitHostPort(addr)
			tok := td.tokens["acme"]
			secret := "output-" + randomToken()
			opts := []client.Option{client.WithAddress("http://" + addr), client.WithToken(tok)}
			if useTLS {
				opts = []client.Option{client.WithAddress("https://" + addr), client.WithToken(tok), client.WithCAFile(p.caFile)}
			}
			c, err := client.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			capt := startCapture(t, port)
			authenticatedCalls(t, c, secret)
			b := capt.stop(t, addr)
			hasTok, hasSecret := bytes.Contains(b, []byte(tok)), bytes.Contains(b, []byte(secret))
			t.Logf("capture: %d bytes, token in it: %v, output in it: %v", len(b), hasTok, hasSecret)
			if !useTLS {
				if !hasTok || !hasSecret {
					t.Fatalf("the plaintext control run's capture lacks the token (%v) or the output (%v): the capture sees nothing", hasTok, hasSecret)
				}
				return
			}
			if hasTok || hasSecret {
				t.Fatalf("over TLS the capture holds the token (%v) or the output (%v) in clear", hasTok, hasSecret)
			}
			// TLS handshake (0x16 0x03) and application data (0x17 0x03 0x03) records.
			if !bytes.Contains(b, []byte{0x16, 0x03, 0x01}) || bytes.Count(b, []byte{0x17, 0x03, 0x03}) < 4 {
				t.Fatalf("the capture holds no TLS records: it saw nothing of the calls")
			}
		})
	}
}

// TestRochedTLSProcess runs roched as its command line does with --tls-cert and
// --tls-key on loopback: /healthz and /metrics answer over TLS to a client trusting the
// CA, and the API with the token.
func TestRochedTLSProcess(t *testing.T) {
	dir := shortDir(t)
	tokFile := filepath.Join(dir, "token")
	tok := writeToken(t, tokFile)
	p := newPKI(t)
	addr := freeAddr(t)
	r := startRochedEnv(t, filepath.Join(dir, "r.sock"), nil, "--providers", "docker", "--listen", "tcp://"+addr,
		"--token-file", tokFile, "--tls-cert", p.cert, "--tls-key", p.key)
	defer stopRoched(t, r)
	var seen serialSeen
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: seen.config(p.caFile, t)}}
	defer hc.CloseIdleConnections()
	for _, path := range []string{"/healthz", "/metrics"} {
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s over TLS: %v\n%s", path, err, r.log)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.TLS == nil {
			t.Fatalf("%s: %s %s", path, resp.Status, b)
		}
	}
	c, err := client.New(client.WithAddress("https://"+addr), client.WithToken(tok), client.WithCAFile(p.caFile), client.WithGRPC())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Providers(ctxFor(t, time.Minute)); err != nil {
		t.Fatalf("gRPC over TLS: %v\n%s", err, r.log)
	}
	if !strings.Contains(r.log.String(), "tls=true") {
		t.Errorf("roched's start line does not say TLS:\n%s", r.log)
	}
}

// TestTLSConfigFile: the config file's tls_cert, tls_key, client_ca and insecure are
// used, and a flag wins over the file.
func TestTLSConfigFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "roched.json")
	os.WriteFile(file, []byte(`{"tls_cert": "/f/cert.pem", "tls_key": "/f/key.pem", "client_ca": "/f/ca.pem", "insecure": true}`), 0o600)
	var f flags
	cmd := command(&f, io.Discard)
	if err := cmd.ParseFlags([]string{"--config", file, "--tls-key", "/flag/key.pem"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := buildConfig(cmd, &f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLSCert != "/f/cert.pem" || cfg.TLSKey != "/flag/key.pem" || cfg.ClientCA != "/f/ca.pem" || !cfg.Insecure {
		t.Fatalf("merged TLS settings %+v", cfg)
	}
}
