package providertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/localca"
)

// RecordingTLS is an HTTPS server on a loopback address of its own, its certificate
// from the test's CA, recording the Authorization header of each request. It answers
// "upstream METHOD PATH".
type RecordingTLS struct {
	*httptest.Server
	mu   sync.Mutex
	auth []string
}

// Seen is the Authorization header of each request so far.
func (s *RecordingTLS) Seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auth...)
}

// UpstreamCA makes a CA of the test's own, whose certificates RecordingServer serves, and
// has egress proxies trust it for upstream hosts: this process's, and those of the
// processes it starts (roched), through egress.RootsEnv, set until the test ends.
func UpstreamCA(t *testing.T) *localca.CA {
	t.Helper()
	return upstreamCA(t, func(t *testing.T, roots string) { t.Setenv(egress.RootsEnv, roots) })
}

// upstreamCA is UpstreamCA with set putting the roots file into egress.RootsEnv.
func upstreamCA(t *testing.T, set func(t *testing.T, roots string)) *localca.CA {
	t.Helper()
	ca, err := localca.New("egress upstream test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(roots, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	set(t, roots)
	return ca
}

// RecordingServer starts a RecordingTLS on ip (a loopback address), closed when the test ends.
func RecordingServer(t *testing.T, ip string, ca *localca.CA) *RecordingTLS {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	s := &RecordingTLS{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.auth = append(s.auth, r.Header.Get("Authorization"))
		s.mu.Unlock()
		fmt.Fprintf(w, "upstream %s %s", r.Method, r.URL.Path)
	}))
	s.Listener = ln
	s.EnableHTTP2 = true
	leaf, err := ca.Server([]string{ip}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

// interceptProbe runs inside the sandbox: HTTPS requests through the proxy with
// Python's default certificate checks (the sandbox's trust store), the secret's
// placeholder from the environment in an Authorization header. It prints what each got,
// then stays alive, holding it all in its memory, until its stdin ends.
const interceptProbe = `
import json, os, sys, urllib.request, urllib.error
bound, unbound = sys.argv[1:3]
tok = os.environ['API_TOKEN']
out = {}
def attempt(name, method, url):
    req = urllib.request.Request(url, method=method, headers={'Authorization': 'Bearer ' + tok})
    try:
        out[name] = 'ok: ' + urllib.request.urlopen(req, timeout=20).read().decode()
    except urllib.error.HTTPError as e:
        out[name] = 'http %d: %s' % (e.code, e.read().decode(errors='replace').strip())
    except Exception as e:
        out[name] = 'error: %s: %s' % (type(e).__name__, e)
attempt('allowed', 'GET', 'https://%s/v1/models' % bound)
attempt('method', 'POST', 'https://%s/v1/models' % bound)
attempt('path', 'GET', 'https://%s/admin' % bound)
attempt('unbound', 'GET', 'https://%s/' % unbound)
print(json.dumps(out), flush=True)
sys.stdin.read()
`

// testEgressIntercept runs EgressIntercept on the suite's provider, whose Capabilities
// say it serves an egress allowlist: every such provider intercepts and brokers secrets.
func (s *suite) testEgressIntercept(t *testing.T) {
	EgressIntercept(t, s.p, s.opts.Config, func(cfg roche.Config) string { return s.create(t, cfg) }, s.opts.HostPIDs)
}

// EgressIntercept checks interception and secrets from inside a sandbox that p makes
// from base with create, against HTTPS servers on loopback addresses of their own whose
// certificates come from a test CA (given to the proxy through egress.RootsEnv): an
// allowed method and path pass, others get 403 naming them, the bound host gets the
// secret's value in place of the placeholder, an unbound host's request carrying the
// placeholder is refused before it leaves and logged, and the value is nowhere in the
// sandbox (its environment, its processes' environments, its files), nor the CA's key.
// With hostPIDs (the host's pids of a sandbox's processes; nil where they are not host
// processes), it also reads, from the host, the environment and the memory of each
// process of the sandbox while the probe that made the requests is still alive. It
// returns the sandbox's id and the secret's value, for the provider's own checks.
func EgressIntercept(t *testing.T, p roche.Provider, base roche.Config, create func(roche.Config) string,
	hostPIDs func(id string) ([]int, error)) (string, string) {
	// The roots under rootsMu (setRoots), not t.Setenv: the suites of two providers run
	// at once (t.Parallel).
	testCA := upstreamCA(t, setRoots)
	bound := RecordingServer(t, "127.0.0.5", testCA)
	unbound := RecordingServer(t, "127.0.0.6", testCA)
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	value := "rs-" + hex.EncodeToString(b)

	cfg := base
	cfg.NetworkAllowlist = []string{"GET https://" + bound.Listener.Addr().String() + "/v1/", "https://" + unbound.Listener.Addr().String() + "/"}
	cfg.Secrets = []roche.Secret{{Name: "API_TOKEN", Value: value, Hosts: []string{bound.Listener.Addr().String()}, Header: "Authorization"}}
	id := create(cfg)

	// The probe runs until its stdin is closed, after the host has looked at it (at once
	// without hostPIDs: a provider may pass stdin on only once it ends, as roched's API
	// does).
	stdin, hold := io.Pipe()
	defer hold.Close()
	if hostPIDs == nil {
		hold.Close()
	}
	printed := &lineWriter{line: make(chan struct{})}
	type result struct {
		res roche.ExecResult
		err error
	}
	ended := make(chan result, 1)
	go func() {
		res, err := p.Exec(context.Background(), id, roche.ExecRequest{Cmd: []string{"python3", "-c", interceptProbe,
			bound.Listener.Addr().String(), unbound.Listener.Addr().String()}, Stdin: stdin, Stdout: printed, Timeout: 2 * time.Minute})
		ended <- result{res, err}
	}()
	select {
	case <-printed.line:
	case r := <-ended:
		t.Fatalf("probe ended before printing: %+v %v", r.res, r.err)
	case <-time.After(3 * time.Minute):
		t.Fatal("the probe printed nothing in 3 minutes")
	}
	var got map[string]string
	if err := json.Unmarshal(printed.bytes(), &got); err != nil {
		t.Fatalf("probe printed %q: %v", printed.bytes(), err)
	}
	for name, want := range map[string]string{
		"allowed": "ok: upstream GET /v1/models",
		"method":  "http 403: roche egress: POST /v1/models on " + bound.Listener.Addr().String() + " is not allowed",
		"path":    "http 403: roche egress: GET /admin on " + bound.Listener.Addr().String() + " is not allowed",
		"unbound": "http 403: roche egress: the placeholder of secret API_TOKEN was sent to " + unbound.Listener.Addr().String(),
	} {
		if !strings.HasPrefix(got[name], want) {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	if auth := bound.Seen(); len(auth) != 1 || auth[0] != "Bearer "+value {
		t.Errorf("the bound host got Authorization %q, want the secret's value once", auth)
	}
	if auth := unbound.Seen(); len(auth) != 0 {
		t.Errorf("the unbound host got %d requests", len(auth))
	}
	placeholder := ""
	if hostPIDs != nil {
		placeholder = hostSideSearch(t, id, value, hostPIDs)
	}
	hold.Close()
	if r := <-ended; r.err != nil || r.res.ExitCode != 0 {
		t.Fatalf("probe: %+v %v", r.res, r.err)
	}

	// The sandbox holds the placeholder, never the value, nor the CA's key: its
	// environment, every process's it can read, and the files where they could be.
	// The value comes on stdin, so that it is in no argv the probe could find.
	look := `env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n'
dirs=$(for d in /etc /tmp /run /root /home /usr/local /var /opt /workspace; do [ -d $d ] && echo $d; done)
grep -rlIF -f /dev/stdin $dirs 2>/dev/null | sed 's/^/FOUND /'
grep -rlI 'PRIVATE KEY' $dirs 2>/dev/null | sed 's/^/FOUND /'; true`
	res, err := p.Exec(context.Background(), id, roche.ExecRequest{Cmd: []string{"sh", "-c", look}, Stdin: strings.NewReader(value + "\n"), Timeout: 2 * time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("looking for the secret: %+v %v", res, err)
	}
	if strings.Contains(res.Stdout, value) || strings.Contains(res.Stdout, "\nFOUND /") {
		t.Errorf("the sandbox holds the secret or a private key:\n%s", res.Stdout)
	}
	if !strings.Contains(res.Stdout, "API_TOKEN=roche-secret-") || !strings.Contains(res.Stdout, "SSL_CERT_FILE="+egress.SandboxBundle) {
		t.Errorf("the sandbox's environment lacks the placeholder or the CA variables:\n%s", res.Stdout)
	}
	if placeholder != "" && !strings.Contains(res.Stdout, "API_TOKEN="+placeholder+"\n") {
		t.Errorf("the host searched the sandbox's memory for placeholder %s, which is not the sandbox's", placeholder)
	}
	// The decision log names each refusal, never the value.
	px := egress.Lookup(id)
	if px == nil {
		t.Fatalf("no egress proxy registered under sandbox id %s", id)
	}
	ds, _ := px.Log(0)
	logged, _ := json.Marshal(ds)
	if strings.Contains(string(logged), value) {
		t.Errorf("the decision log holds the secret: %s", logged)
	}
	for _, want := range []string{`"method":"POST","path":"/v1/models"`, `"path":"/admin"`, "placeholder of secret API_TOKEN was sent to " + unbound.Listener.Addr().String()} {
		if !strings.Contains(string(logged), want) {
			t.Errorf("the decision log lacks %s: %s", want, logged)
		}
	}
	return id, value
}

// hostSideSearch reads, from the host, /proc/PID/environ and every readable mapping of
// /proc/PID/mem of each process of sandbox id, and fails the test if value is in any.
// So that it cannot pass by reading nothing, the secret's placeholder (the probe holds
// it) must be found in some process's memory; it returns that placeholder.
func hostSideSearch(t *testing.T, id, value string, hostPIDs func(string) ([]int, error)) string {
	t.Helper()
	pids, err := hostPIDs(id)
	if err != nil || len(pids) == 0 {
		t.Fatalf("the host's pids of sandbox %s: %v %v", id, pids, err)
	}
	placeholder := regexp.MustCompile(`roche-secret-[0-9a-f]{32}`)
	var seen string
	for _, pid := range pids {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue // gone
		}
		if strings.Contains(string(env), value) {
			t.Errorf("process %d of the sandbox has the secret in its environment", pid)
		}
		n, found, err := searchMemory(pid, []byte(value), placeholder)
		if err != nil {
			t.Errorf("reading the memory of process %d: %v", pid, err)
			continue
		}
		t.Logf("process %d: read %d bytes of its memory", pid, n)
		if found.value {
			t.Errorf("process %d of the sandbox has the secret in its memory", pid)
		}
		if found.placeholder != "" {
			seen = found.placeholder
		}
	}
	if seen == "" {
		t.Fatalf("the placeholder is in the memory of none of the sandbox's processes %v: the search read the wrong thing", pids)
	}
	return seen
}

// rootsMu lets one EgressIntercept at a time give the proxy its test CA through
// egress.RootsEnv, which is the process's environment: the suites of two providers may
// run at once (t.Parallel), where t.Setenv is refused, and each must find its own CA
// there while its proxies verify upstreams.
var rootsMu sync.Mutex

// setRoots sets egress.RootsEnv to roots until the test ends, holding rootsMu as long.
func setRoots(t *testing.T, roots string) {
	rootsMu.Lock()
	t.Cleanup(rootsMu.Unlock)
	old, had := os.LookupEnv(egress.RootsEnv)
	if err := os.Setenv(egress.RootsEnv, roots); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if had {
			_ = os.Setenv(egress.RootsEnv, old)
		} else {
			_ = os.Unsetenv(egress.RootsEnv)
		}
	})
}

type memFound struct {
	value       bool
	placeholder string
}

// searchMemory reads the memory process pid holds, through /proc/PID/mem, and reports
// whether value is in it, and a match of placeholder, with the bytes read. It reads the
// pages of each readable mapping that are resident or swapped out (/proc/PID/pagemap),
// never one the process has not touched: reading that would fault it in, and in a
// mapping of a memory file (gVisor's kernel keeps its tasks' memory in one) allocate
// it, charged to the sandbox, which a search of the whole mapping would end of OOM.
// What the process never touched holds nothing of it.
func searchMemory(pid int, value []byte, placeholder *regexp.Regexp) (int64, memFound, error) {
	var found memFound
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, found, err
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return 0, found, err
	}
	defer mem.Close()
	pagemap, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return 0, found, err
	}
	defer pagemap.Close()
	const chunk = 1 << 20
	buf := make([]byte, chunk+len(value)+64)
	var total int64
	search := func(start, end uint64) {
		for off := start; off < end; off += chunk {
			n := min(uint64(len(buf)), end-off)
			got, _ := mem.ReadAt(buf[:n], int64(off))
			if got <= 0 {
				return // unreadable (a guard page, a device mapping)
			}
			total += int64(got)
			b := buf[:got]
			if bytes.Contains(b, value) {
				found.value = true
			}
			if m := placeholder.Find(b); m != nil {
				found.placeholder = string(m)
			}
		}
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[1], "r") || strings.HasSuffix(line, "[vvar]") || strings.HasSuffix(line, "[vsyscall]") {
			continue
		}
		var start, end uint64
		if _, err := fmt.Sscanf(f[0], "%x-%x", &start, &end); err != nil {
			continue
		}
		if err := residentRuns(pagemap, start, end, search); err != nil {
			return total, found, err
		}
	}
	return total, found, nil
}

// residentRuns calls f with each run of pages in [start, end) that are resident or
// swapped out, as /proc/PID/pagemap says (bits 63 and 62 of each page's entry).
func residentRuns(pagemap *os.File, start, end uint64, f func(start, end uint64)) error {
	page := uint64(os.Getpagesize())
	const batch = 1 << 16 // entries per read: 512 KiB, 256 MiB of memory
	entries := make([]byte, 8*batch)
	runStart, inRun := uint64(0), false
	for addr := start; addr < end; {
		n := min(batch, (end-addr)/page)
		got, err := pagemap.ReadAt(entries[:8*n], int64(addr/page*8))
		if got < 8 {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("reading pagemap at %#x: %w", addr, err)
		}
		for i := 0; i+8 <= got; i += 8 {
			e := binary.LittleEndian.Uint64(entries[i:])
			held := e&(1<<63) != 0 || e&(1<<62) != 0
			switch {
			case held && !inRun:
				runStart, inRun = addr, true
			case !held && inRun:
				f(runStart, addr)
				inRun = false
			}
			addr += page
		}
	}
	if inRun {
		f(runStart, end)
	}
	return nil
}

// lineWriter keeps what is written, and closes line at the first newline.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	line chan struct{}
	done bool
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	if !w.done && bytes.IndexByte(w.buf, '\n') >= 0 {
		w.done = true
		close(w.line)
	}
	return len(b), nil
}

func (w *lineWriter) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	line, _, _ := bytes.Cut(w.buf, []byte("\n"))
	return append([]byte(nil), line...)
}

// EgressTrustOutOfReach checks, from inside a sandbox that p makes from base as root
// (the user that owns, inside, what the host user owns: roched's usual uid), that what
// the host keeps for the sandbox's CA and secrets is out of its reach: the trust store and
// the CA at their paths cannot be written, replaced or removed (they are the host's,
// bound read-only), and the directory of the agent's socket, which the sandbox can write,
// holds only sockets (a file of the host's there could be forged, or replaced by a
// symlink that the host's next write follows), or but the files named in others, which
// the caller vouches for.
func EgressTrustOutOfReach(t *testing.T, p roche.Provider, base roche.Config, create func(roche.Config) string, others ...string) {
	t.Helper()
	cfg := base
	cfg.User = "root"
	cfg.NetworkAllowlist = []string{"https://127.0.0.5:8443/"}
	cfg.Secrets = []roche.Secret{{Name: "API_TOKEN", Value: "rs-out-of-reach", Hosts: []string{"127.0.0.5:8443"}}}
	id := create(cfg)
	probe := `id -u
for f in ` + egress.SandboxBundle + ` ` + egress.SandboxCACert + `; do
  [ -s $f ] || echo "MISSING $f"
  (echo forged > $f) 2>/dev/null && echo "WROTE $f"
  (echo forged > /tmp/forged && mv -f /tmp/forged $f) 2>/dev/null && echo "REPLACED $f"
  rm -f $f 2>/dev/null && echo "REMOVED $f"
done
ls -A /.roche/run 2>/dev/null | sed 's/^/RUN /'; true`
	res, err := p.Exec(context.Background(), id, roche.ExecRequest{Cmd: []string{"sh", "-c", probe}, Timeout: time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("probing the trust files: %+v %v", res, err)
	}
	if !strings.HasPrefix(res.Stdout, "0\n") {
		t.Fatalf("the sandbox's user is not root (%q): the probe tests nothing", res.Stdout)
	}
	for _, line := range strings.Split(res.Stdout, "\n") {
		switch verb, rest, _ := strings.Cut(line, " "); verb {
		case "MISSING", "WROTE", "REPLACED", "REMOVED":
			t.Errorf("a root sandbox: %s", line)
		case "RUN":
			if !strings.HasSuffix(rest, ".sock") && !slices.Contains(others, rest) {
				t.Errorf("the sandbox's socket directory holds %s, which is not a socket: the host's files belong out of its reach", rest)
			}
		}
	}
}
