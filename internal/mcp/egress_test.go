package mcp_test

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/mcp"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestEgressLog: a sandbox made through roched with allow_hosts reaches the host listed
// and is refused another; egress_log shows both, the refusal with its reason and the
// entry it needed, bounded by max_decisions (the rest counted as omitted) and filtered by
// refused_only. allow_hosts is network, refused unless the server allows it; a server
// running sandboxes in-process (no roched) says the log is roched's.
func TestEgressLog(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	allowed, other := providertest.OKServer(t, "127.0.0.31"), providertest.OKServer(t, "127.0.0.32")
	d := daemontest.Serve(t, daemon.Config{})
	s := mcp.New(providers{d.Client.Provider("docker")}, mcp.Config{AllowNetwork: true, DefaultImage: testenv.Image()})
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	cs := connect(t, s)

	var sb mcp.Sandbox
	if text, isErr := call(t, cs, "create_sandbox", map[string]any{"allow_hosts": []string{allowed}}, &sb); isErr {
		t.Fatalf("create_sandbox with allow_hosts: %s", text)
	}
	var ex mcp.ExecOutput
	if text, isErr := call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID,
		"command": []string{"python3", "-c", providertest.GetEach, "http://" + allowed + "/a", "http://" + other + "/b", "http://" + allowed + "/c"}}, &ex); isErr || strings.TrimSpace(ex.Stdout) != "200 403 200" {
		t.Fatalf("exec: %s %+v, want the listed host reached and the other refused", text, ex)
	}

	var log mcp.EgressLogOutput
	text, isErr := call(t, cs, "egress_log", map[string]any{"sandbox_id": sb.ID}, &log)
	if isErr || len(log.Decisions) != 3 || log.Omitted != 0 {
		t.Fatalf("egress_log: %s %+v, want the three requests", text, log)
	}
	refused := log.Decisions[1]
	if !log.Decisions[0].Allowed || refused.Allowed || net.JoinHostPort(refused.Host, strconv.Itoa(refused.Port)) != other || refused.Rule != other ||
		refused.Reason == "" || !slices.Equal(log.Suggested, []string{other}) {
		t.Fatalf("egress_log = %+v, want %s allowed and %s refused with its reason and the entry it needed", log, allowed, other)
	}
	if !strings.Contains(text, "REFUSED GET "+other) || !strings.Contains(text, "allow_hosts entries the refusals needed: "+other) {
		t.Fatalf("egress_log's text:\n%s", text)
	}
	if _, isErr := call(t, cs, "egress_log", map[string]any{"sandbox_id": sb.ID, "max_decisions": 1}, &log); isErr ||
		len(log.Decisions) != 1 || log.Omitted != 2 || log.Decisions[0].Path != "/c" {
		t.Fatalf("egress_log max_decisions 1: %+v, want the last one and 2 omitted", log)
	}
	if _, isErr := call(t, cs, "egress_log", map[string]any{"sandbox_id": sb.ID, "refused_only": true}, &log); isErr ||
		len(log.Decisions) != 1 || log.Decisions[0].Allowed || log.Omitted != 0 {
		t.Fatalf("egress_log refused_only: %+v, want the one refusal", log)
	}
	if text, isErr := call(t, cs, "egress_log", map[string]any{"sandbox_id": sb.ID, "max_decisions": mcp.MaxEgressDecisions + 1}, nil); !isErr ||
		!strings.Contains(text, "give 1 to 500") {
		t.Fatalf("egress_log with max_decisions too large: %s", text)
	}
	// Another session's sandbox is "not found", its log included.
	if text, isErr := call(t, connect(t, s), "egress_log", map[string]any{"sandbox_id": sb.ID}, nil); !isErr || !strings.Contains(text, "no sandbox "+sb.ID+" in this session") {
		t.Fatalf("egress_log of another session's sandbox: %s", text)
	}

	// allow_hosts is network: refused by a server without --allow-network.
	closed := mcp.New(providers{d.Client.Provider("docker")}, mcp.Config{DefaultImage: testenv.Image()})
	t.Cleanup(func() { closed.Close(context.Background()) })
	if text, isErr := call(t, connect(t, closed), "create_sandbox", map[string]any{"allow_hosts": []string{allowed}}, nil); !isErr || !strings.Contains(text, "network access is off") {
		t.Fatalf("create_sandbox with allow_hosts on a server without network: %s", text)
	}

	// In-process, no roched keeps a log: egress_log says so.
	local, _ := newServer(t, mcp.Config{})
	lcs := connect(t, local)
	if text, isErr := call(t, lcs, "create_sandbox", map[string]any{}, &sb); isErr {
		t.Fatalf("create_sandbox in-process: %s", text)
	}
	if text, isErr := call(t, lcs, "egress_log", map[string]any{"sandbox_id": sb.ID}, nil); !isErr || !strings.Contains(text, "roche daemon start") {
		t.Fatalf("egress_log in-process: %s, want it to say the log is roched's", text)
	}
}
