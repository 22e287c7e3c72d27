package agentspec_test

import (
	"io"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest/guestcmd"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
)

// TestArgsReadBack: every field of a Spec reaches the agent's config through
// roche-agent's own flags, so that a provider's intent and the agent's reading of it
// cannot drift apart.
func TestArgsReadBack(t *testing.T) {
	egressSock := filepath.Join(t.TempDir(), "egress.sock")
	spec := agentspec.Spec{
		Socket: "/.roche/run/agent.sock", Owner: 1234, User: "1900000001:1900000001",
		Lifetime: 90 * time.Second, NProc: 77, ForkAsUser: true, ScratchMax: 64 << 20, Own: "/workspace",
		ChownFrom: 1900000002, EgressSocket: egressSock, Lease: 30 * time.Second,
	}
	cfg, version, err := guestcmd.Parse(spec.Args(), io.Discard)
	if err != nil || version {
		t.Fatalf("roche-agent does not read %q: %v (version %v)", spec.Args(), err, version)
	}
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"socket", cfg.Socket, spec.Socket},
		{"owner", cfg.SocketOwner, spec.Owner},
		{"user", cfg.User, spec.User},
		{"lifetime", cfg.Lifetime, spec.Lifetime},
		{"nproc", cfg.NProc, spec.NProc},
		{"fork as user", cfg.ForkAsUser, true},
		{"scratch max", cfg.ScratchMax, int64(64 << 20)},
		{"own", slices.Equal(cfg.Own, []string{spec.Own}), true},
		{"chown from", cfg.ChownFrom, spec.ChownFrom},
		{"egress listen", cfg.EgressListen, egress.SandboxListen},
		{"lease grace", cfg.LeaseGrace, agentspec.LeaseGrace},
		{"first lease", cfg.FirstLease, agentspec.FirstLease(spec.Lease)},
		{"open files", cfg.NoFile, 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: the agent read %v, the spec said %v", c.name, c.got, c.want)
		}
	}
	// The egress relay dials the socket the spec named.
	l, err := net.Listen("unix", egressSock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if cfg.EgressDial == nil {
		t.Fatal("no egress relay")
	}
	conn, err := cfg.EgressDial()
	if err != nil {
		t.Fatalf("the agent's egress relay does not reach %s: %v", egressSock, err)
	}
	conn.Close()

	// And what a zero Spec leaves out, the agent leaves off.
	cfg, _, err = guestcmd.Parse(agentspec.Spec{Socket: "/s", User: "1:1"}.Args(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NProc != 0 || cfg.ConnFD != 0 || cfg.ForkAsUser || cfg.ScratchMax != 0 || cfg.Own != nil || cfg.ChownFrom != 0 || cfg.EgressDial != nil || cfg.LeaseGrace != 0 || cfg.Lifetime != 0 {
		t.Errorf("a bare spec set more: %+v", cfg)
	}
}

// TestConnFDReadBack: a one-shot sandbox's agent serves the descriptor it is given, and
// no socket.
func TestConnFDReadBack(t *testing.T) {
	cfg, _, err := guestcmd.Parse(agentspec.Spec{Socket: "/s", ConnFD: 3, User: "1:1"}.Args(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConnFD != 3 {
		t.Errorf("the agent read descriptor %d, the spec said 3", cfg.ConnFD)
	}
}

func TestLifetimeFlag(t *testing.T) {
	for d, want := range map[time.Duration]string{3600 * time.Second: "3600s", 1500 * time.Millisecond: "1.5s", 0: "0s"} {
		args := agentspec.Spec{Lifetime: d}.Args()
		i := slices.Index(args, "--lifetime")
		if i < 0 || args[i+1] != want {
			t.Errorf("lifetime %v: %q, want --lifetime %s", d, args, want)
		}
	}
}
