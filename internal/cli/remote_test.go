package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	rocheclient "github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/localca"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestDaemonStartTLS: roche daemon start --tls makes a local CA and a certificate under
// roched's state directory (keys 0600), serves TCP with them and prints what clients
// set; roche --address with --ca (or ROCHE_CA_FILE) runs commands and roche mcp through
// it; without the CA, or with another, the CLI fails in one line saying to give it, and
// does not fall back to running in-process. A second start keeps the CA.
func TestDaemonStartTLS(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := socketDir(t)
	socket := filepath.Join(dir, "roched.sock")
	logFile := filepath.Join(dir, "roched.log")
	t.Setenv("ROCHED_TEST_AS_DAEMON", "1")
	tokenFile := filepath.Join(dir, "token")
	tb := make([]byte, 16)
	rand.Read(tb)
	token := hex.EncodeToString(tb)
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	start := func(extra ...string) result {
		t.Helper()
		args := append([]string{"--socket", socket, "daemon", "start", "--roched", os.Args[0], "--log", logFile,
			"--listen", "tcp://" + addr, "--tls", "--token-file", tokenFile}, extra...)
		r := run(t, append(args, "--", "--providers", "docker")...)
		if r.code != 0 {
			log, _ := os.ReadFile(logFile)
			t.Fatalf("daemon start --tls: %+v\n%s", r, log)
		}
		return r
	}
	r := start()
	defer func() {
		if r := run(t, "--socket", socket, "daemon", "stop"); r.code != 0 {
			t.Errorf("cleanup stop: %+v", r)
		}
	}()
	tlsDir := filepath.Join(dir, "tls")
	p := localca.PathsIn(tlsDir)
	if want := "ROCHE_ADDRESS=https://" + addr + " ROCHE_CA_FILE=" + p.CA; !strings.Contains(r.stdout, want) {
		t.Fatalf("daemon start --tls printed %q, want %q", r.stdout, want)
	}
	for f, mode := range map[string]os.FileMode{tlsDir: 0o700, p.CAKey: 0o600, p.Key: 0o600, p.CA: 0o644, p.Cert: 0o644} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %04o", f, fi, err, mode)
		}
	}
	caBefore, _ := os.ReadFile(p.CA)

	// The CLI through TCP, with the token from ROCHE_TOKEN_FILE; the socket it would
	// otherwise use does not exist, so nothing could be served locally.
	t.Setenv("ROCHE_TOKEN_FILE", tokenFile)
	noSocket := filepath.Join(dir, "none.sock")
	remote := []string{"--socket", noSocket, "--address", "https://" + addr}
	rr := run(t, append(remote, "--ca", p.CA, "run", "--image", testImage(), "--", "echo", "over tls")...)
	if rr.code != 0 || rr.stdout != "over tls\n" {
		t.Fatalf("roche --address --ca run: %+v", rr)
	}
	t.Setenv("ROCHE_CA_FILE", p.CA)
	if rr := run(t, append(remote, "list")...); rr.code != 0 {
		t.Fatalf("roche --address list with ROCHE_CA_FILE: %+v", rr)
	}
	t.Setenv("ROCHE_CA_FILE", "")
	other, err := localca.New("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(dir, "other-ca.pem")
	os.WriteFile(otherCA, other.CertPEM, 0o644)
	for name, args := range map[string][]string{
		"no CA":       append(remote, "list"),
		"another CA":  append(remote, "--ca", otherCA, "list"),
		"another CA2": append(remote, "--ca", otherCA, "run", "--image", testImage(), "--", "true"),
	} {
		rr := run(t, args...)
		msg := strings.TrimSpace(rr.stderr)
		if rr.code == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, "does not trust") || !strings.Contains(msg, "--ca FILE") {
			t.Errorf("%s: %+v: want one line saying the certificate is not trusted and to give --ca", name, rr)
		}
	}
	if rr := run(t, "--socket", noSocket, "--address", "tcp://"+addr, "list"); rr.code == 0 || !strings.Contains(rr.stderr, "use https://"+addr) {
		t.Errorf("--address tcp://: %+v", rr)
	}

	// roche mcp through the same roched: its sandbox is roched's, of the tenant default.
	tc, err := rocheclient.New(rocheclient.WithAddress("https://"+addr), rocheclient.WithToken(token), rocheclient.WithCAFile(p.CA))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	cs, stderr := mcpRemote(t, noSocket, "ROCHE_ADDRESS=https://"+addr, "ROCHE_CA_FILE="+p.CA, "ROCHE_TOKEN_FILE="+tokenFile)
	var sb struct{ ID string }
	mcpCall(t, cs, "create_sandbox", nil, &sb)
	list, err := tc.Provider("docker").List(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != sb.ID || !strings.HasSuffix(list[0].Owner, "/default") {
		t.Fatalf("roched over TLS lists %+v (%v), want the MCP server's sandbox %s\n%s", list, err, sb.ID, stderr)
	}
	cs.Close()
	bad, _ := mcpRemote(t, noSocket, "ROCHE_ADDRESS=https://"+addr, "ROCHE_CA_FILE="+otherCA, "ROCHE_TOKEN_FILE="+tokenFile)
	res, err := bad.CallTool(context.Background(), &sdk.CallToolParams{Name: "create_sandbox"})
	if err == nil && !res.IsError {
		t.Fatalf("roche mcp with another CA created a sandbox: %+v", res)
	}
	if err == nil {
		text := ""
		for _, c := range res.Content {
			if tc, ok := c.(*sdk.TextContent); ok {
				text += tc.Text
			}
		}
		if !strings.Contains(text, "does not trust") {
			t.Errorf("roche mcp with another CA: %q", text)
		}
	}
	bad.Close()

	// A restart keeps the CA clients trust, and the certificate; with --client-ca on
	// that CA, a client certificate from roche daemon client-cert is its tenant's
	// credential, and a client without one is refused in one line.
	if rr := run(t, "--socket", socket, "daemon", "stop"); rr.code != 0 {
		t.Fatalf("stop: %+v", rr)
	}
	start("--client-ca", p.CA)
	if caAfter, _ := os.ReadFile(p.CA); !bytes.Equal(caBefore, caAfter) {
		t.Fatal("a second daemon start --tls made a new CA")
	}
	certDir := filepath.Join(dir, "acme-tls")
	cr := run(t, "--socket", socket, "daemon", "client-cert", "acme", "--out", certDir)
	cert, key := filepath.Join(certDir, "acme-client.pem"), filepath.Join(certDir, "acme-client-key.pem")
	if cr.code != 0 || !strings.Contains(cr.stdout, "ROCHE_CLIENT_CERT="+cert+" ROCHE_CLIENT_KEY="+key) {
		t.Fatalf("daemon client-cert: %+v", cr)
	}
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("client key %v %v, want mode 0600", fi, err)
	}
	t.Setenv("ROCHE_TOKEN_FILE", "")
	rr = run(t, append(remote, "--ca", p.CA, "--client-cert", cert, "--client-key", key, "run", "--image", testImage(), "--", "echo", "by certificate")...)
	if rr.code != 0 || rr.stdout != "by certificate\n" {
		t.Fatalf("with acme's client certificate and no token: %+v", rr)
	}
	t.Setenv("ROCHE_CLIENT_CERT", cert)
	t.Setenv("ROCHE_CLIENT_KEY", key)
	if rr := run(t, append(remote, "--ca", p.CA, "list")...); rr.code != 0 {
		t.Fatalf("with ROCHE_CLIENT_CERT and ROCHE_CLIENT_KEY: %+v", rr)
	}
	t.Setenv("ROCHE_CLIENT_CERT", "")
	t.Setenv("ROCHE_CLIENT_KEY", "")
	t.Setenv("ROCHE_TOKEN_FILE", tokenFile)
	rr = run(t, append(remote, "--ca", p.CA, "list")...)
	if msg := strings.TrimSpace(rr.stderr); rr.code == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, "--client-cert") {
		t.Fatalf("without a client certificate: %+v", rr)
	}
}

// mcpRemote runs roche mcp (this test binary as the CLI) with env, over stdio.
func mcpRemote(t *testing.T, socket string, env ...string) (*sdk.ClientSession, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "mcp", "--image", testImage())
	cmd.Env = append(append(os.Environ(), "ROCHE_TEST_AS_CLI=1", "ROCHE_SOCKET="+socket), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &sdk.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connecting to roche mcp: %v\n%s", err, stderr.String())
	}
	return cs, &stderr
}
