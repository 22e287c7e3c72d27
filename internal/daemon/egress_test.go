package daemon

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// TestEgressAllowlistThroughDaemon: the allowlist travels through the API and roched runs
// the sandbox's proxy (pool.Spec.Matches keeps allowlists out of pools: no relay there).
func TestEgressAllowlistThroughDaemon(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.8:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "through the daemon")
	}))
	srv.Listener = ln
	srv.Start()
	defer srv.Close()

	td := startDaemon(t, Config{})
	ctx := ctxFor(t, time.Minute)
	cfg := pyConfig()
	cfg.NetworkAllowlist = []string{ln.Addr().String()}
	sb, err := td.p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer td.p.Destroy(ctx, sb.ID)
	code := "import urllib.request, sys\nprint(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", code, srv.URL}})
	if err != nil || res.ExitCode != 0 || res.Stdout != "through the daemon\n" {
		t.Fatalf("allowed host through roched: %+v %v", res, err)
	}
	res, err = td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", code, "http://127.0.0.9:1/"}})
	if err != nil || res.ExitCode == 0 || !strings.Contains(res.Stderr, "403") {
		t.Fatalf("unlisted host through roched: %+v %v", res, err)
	}
}
