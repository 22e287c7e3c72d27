package daemon

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// statusScript prints the HTTP status of a GET of each URL in argv, one a line.
const statusScript = `
import sys, urllib.request, urllib.error
for u in sys.argv[1:]:
    try:
        print(urllib.request.urlopen(u, timeout=10).status)
    except urllib.error.HTTPError as e:
        print(e.code)
`

func localServer(t *testing.T, ip, body string) string {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}

// TestEgressLogAndLivePolicyThroughDaemon: a real Docker sandbox's requests, allowed and
// refused, are in its decision log through the API (its tenant's only), in the audit log
// and the metrics; an entry added through the API lets the next request through, one
// removed refuses it again.
func TestEgressLogAndLivePolicyThroughDaemon(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	allowed := localServer(t, "127.0.0.8", "allowed")
	later := localServer(t, "127.0.0.9", "later")

	td := startTenantDaemon(t, Config{}, []string{"alice", "bob"}, nil)
	ctx := ctxFor(t, 2*time.Minute)
	alice, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["alice"]))
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	bob, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["bob"]))
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	p := alice.Provider("docker")
	cfg := pyConfig()
	cfg.NetworkAllowlist = []string{allowed}
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, sb.ID)
	statuses := func(urls ...string) string {
		t.Helper()
		res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: append([]string{"python3", "-c", statusScript}, urls...)})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("requests from the sandbox: %+v %v", res, err)
		}
		return strings.Join(strings.Fields(res.Stdout), " ")
	}
	if got := statuses("http://"+allowed+"/pkg", "http://"+later+"/x"); got != "200 403" {
		t.Fatalf("statuses %q, want 200 403", got)
	}

	var log client.EgressLog
	eventually(t, 10*time.Second, "both decisions, the allowed one ended", func() bool {
		log, err = alice.EgressLog(ctx, sb.ID, 0)
		return err == nil && len(log.Decisions) == 2 && log.Decisions[0].Done
	})
	ok, refused := log.Decisions[0], log.Decisions[1]
	if !ok.Allowed || ok.Method != "GET" || ok.Path != "/pkg" || ok.Rule != allowed || ok.Tenant != "alice" ||
		ok.Sandbox != sb.ID || ok.BytesIn == 0 || ok.BytesOut == 0 {
		t.Fatalf("allowed request logged as %+v", ok)
	}
	if refused.Allowed || refused.Rule != later || !strings.Contains(refused.Reason, "allowlist") || refused.Seq != 2 {
		t.Fatalf("refused request logged as %+v", refused)
	}
	if !slices.Equal(log.Suggested, []string{later}) {
		t.Fatalf("suggested %q, want %q", log.Suggested, later)
	}
	// Another tenant cannot read it nor change it.
	if _, err := bob.EgressLog(ctx, sb.ID, 0); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob reading alice's egress log: %v, want not found", err)
	}
	if _, err := bob.EgressPolicy(ctx, sb.ID, []string{later}, nil); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob changing alice's egress policy: %v, want not found", err)
	}

	// Live policy: allowed from the next request, refused again once removed.
	rules, err := alice.EgressPolicy(ctx, sb.ID, []string{later}, nil)
	if err != nil || !slices.Equal(rules, []string{allowed, later}) {
		t.Fatalf("allowing %s: %q %v", later, rules, err)
	}
	if got := statuses("http://" + later + "/x"); got != "200" {
		t.Fatalf("after allowing: %q", got)
	}
	if rules, err = alice.EgressPolicy(ctx, sb.ID, nil, []string{later}); err != nil || !slices.Equal(rules, []string{allowed}) {
		t.Fatalf("removing %s: %q %v", later, rules, err)
	}
	if got := statuses("http://" + later + "/x"); got != "403" {
		t.Fatalf("after removing: %q", got)
	}
	if _, err := alice.EgressPolicy(ctx, sb.ID, nil, []string{"nowhere.example"}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("removing an absent entry: %v", err)
	}
	if _, err := alice.EgressPolicy(ctx, sb.ID, []string{"http://x/"}, nil); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("allowing a bad entry: %v", err)
	}

	eventually(t, 10*time.Second, "four decisions", func() bool {
		log, err = alice.EgressLog(ctx, sb.ID, 2)
		return err == nil && len(log.Decisions) == 2 && log.Decisions[0].Done
	})
	if !log.Decisions[0].Allowed || log.Decisions[0].Rule != later || log.Decisions[1].Allowed {
		t.Fatalf("decisions after the changes: %+v", log.Decisions)
	}

	// The audit log has each decision and each change; the metrics count them.
	lines := td.auditLines(t)
	for _, want := range []map[string]any{
		{"op": "egress", "tenant": "alice", "id": sb.ID, "host": "127.0.0.8", "path": "/pkg", "ok": true},
		{"op": "egress", "tenant": "alice", "id": sb.ID, "host": "127.0.0.9", "rule": later, "ok": false},
		{"op": "egress_policy", "tenant": "alice", "id": sb.ID, "allow": []string{later}, "ok": true},
	} {
		if !hasAudit(lines, want) {
			t.Errorf("no audit line with %v", want)
		}
	}
	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://roched/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`roche_egress_decisions_total{decision="allowed"} 2`, `roche_egress_decisions_total{decision="refused"} 2`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if egress.Lookup(sb.ID) == nil {
		t.Fatal("the proxy is not found by the sandbox's id")
	}
}
