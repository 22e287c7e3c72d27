package daemon

import (
	"context"
	"errors"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/pool"
)

// engineClient is a plain Engine API client, for doing to a test's own containers (by
// id) what someone behind roched's back would.
func engineClient(t *testing.T) *dockerclient.Client {
	t.Helper()
	c, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// metricsText scrapes the daemon's /metrics.
func (td *testDaemon) metricsText(t *testing.T) string {
	t.Helper()
	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://roched/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricValue reads one sample of the scraped metrics, or -1.
func metricValue(text, sample string) int {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return int(v)
}

// tracked returns the kind of the daemon's record of id, or "" when it has none.
func (td *testDaemon) tracked(id string) ledger.Kind {
	r, _ := td.d.ledger.Tracked(id)
	return r.Kind
}

// TestDeadPoolMember: an idle pooled sandbox killed behind roched's back (docker kill of
// its container, by id) is no longer counted within seconds — not in the pool, its
// records, the state file or the metrics — long before the next reconciliation; the pool
// refills, and every create returns a live sandbox.
func TestDeadPoolMember(t *testing.T) {
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=2&max=2&idle_timeout=120")
	if err != nil {
		t.Fatal(err)
	}
	// No reconciliation during the test: whatever notices the death, it is not that.
	td := startDaemon(t, Config{Pools: []pool.Spec{spec}, ReconcileInterval: time.Hour})
	ctx := ctxFor(t, 3*time.Minute)
	key := spec.Key.String()
	if _, err := td.c.PoolWarmup(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	pl := td.d.ledger.Pools()[0]
	ids := pl.IdleIDs()
	if len(ids) != 2 {
		t.Fatalf("after warmup: idle %v", ids)
	}
	victim := ids[0]
	dc := engineClient(t)
	killed := time.Now()
	if err := dc.ContainerKill(ctx, victim, "KILL"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "roched to stop counting the killed sandbox", func() bool {
		return td.tracked(victim) != ledger.KindPooled && !slices.Contains(pl.IdleIDs(), victim) && pl.Status().Dead == 1
	})
	t.Logf("the killed idle sandbox was dropped %v after the kill", time.Since(killed).Round(time.Millisecond))
	m := td.metricsText(t)
	if v := metricValue(m, `roche_pool_dead_total{pool="`+key+`"}`); v != 1 {
		t.Errorf("roche_pool_dead_total %d, want 1", v)
	}
	eventually(t, 10*time.Second, "the dead sandbox to leave the records, the state file and the engine", func() bool {
		b, err := os.ReadFile(td.d.cfg.StateFile)
		return err == nil && td.tracked(victim) == "" && !strings.Contains(string(b), victim) && td.gone(victim)
	})
	eventually(t, time.Minute, "the pool to refill", func() bool {
		now := pl.IdleIDs()
		return len(now) == 2 && !slices.Contains(now, victim)
	})

	// Every create gets a sandbox that runs commands: two from the pool, the rest cold or
	// from the refill.
	const n = 4
	var made []string
	defer func() {
		for _, id := range made {
			_ = td.p.Destroy(context.Background(), id)
		}
	}()
	for i := range n {
		sb, pooled, err := td.c.Create(ctx, "docker", pyConfig())
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		made = append(made, sb.ID)
		if sb.ID == victim {
			t.Fatalf("create %d was handed the killed sandbox", i)
		}
		res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(1)"}})
		if err != nil || res.ExitCode != 0 || res.Stdout != "1\n" {
			t.Fatalf("create %d (pooled %v): exec: %+v %v", i, pooled, res, err)
		}
	}
}

// TestDeadSandboxThroughDaemon: a client's sandbox that dies says so through roched: a
// command running in it ends with an error naming the sandbox and why (not a bare exit
// 143 or 137), and one that dies while nothing runs is forgotten within seconds, later
// calls hearing why it is gone.
func TestDeadSandboxThroughDaemon(t *testing.T) {
	td := startDaemon(t, Config{ReconcileInterval: time.Hour})
	dc := engineClient(t)
	for _, tc := range []struct {
		name, signal, want string
		stream             bool
	}{
		{"killed", "KILL", "is gone", false},
		{"stopped by its engine", "TERM", "stopped while the command ran: the sandbox is stopping: its engine stopped it", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxFor(t, 2*time.Minute)
			sb, _, err := td.c.Create(ctx, "docker", pyConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer td.p.Destroy(context.Background(), sb.ID)
			started := make(chan struct{})
			req := roche.ExecRequest{Cmd: []string{"sh", "-c", "echo ready > /tmp/ready; echo ready; exec sleep 30"}}
			if tc.stream {
				req.Stdout = &closeOnWrite{ch: started}
			}
			type outcome struct {
				res roche.ExecResult
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := td.p.Exec(ctx, sb.ID, req)
				done <- outcome{res, err}
			}()
			if tc.stream {
				<-started
			} else {
				eventually(t, 20*time.Second, "the command to start", func() bool {
					res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"test", "-e", "/tmp/ready"}})
					return err == nil && res.ExitCode == 0
				})
			}
			if err := dc.ContainerKill(ctx, sb.ID, tc.signal); err != nil {
				t.Fatal(err)
			}
			var o outcome
			select {
			case o = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the command did not end within 20 s of its sandbox stopping")
			}
			if o.err == nil {
				t.Fatalf("exec through roched ended with %+v and no error, want one saying the sandbox stopped", o.res)
			}
			if !errors.Is(o.err, roche.ErrNotFound) || connectCode(o.err) != connect.CodeNotFound ||
				!strings.Contains(o.err.Error(), tc.want) || !strings.Contains(o.err.Error(), sb.ID) {
				t.Fatalf("exec error %q (code %v), want NOT_FOUND naming sandbox %s and saying %q", o.err, connectCode(o.err), sb.ID, tc.want)
			}
			eventually(t, 10*time.Second, "roched to forget it", func() bool { return td.tracked(sb.ID) == "" })
			_, err = td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}})
			if !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "ended at") {
				t.Fatalf("exec after it ended: %v, want not found saying it ended", err)
			}
			eventually(t, 10*time.Second, "the engine to finish removing it", func() bool { return td.gone(sb.ID) })
		})
	}

	t.Run("killed while idle", func(t *testing.T) {
		ctx := ctxFor(t, 2*time.Minute)
		sb, _, err := td.c.Create(ctx, "docker", pyConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer td.p.Destroy(context.Background(), sb.ID)
		running := metricValue(td.metricsText(t), `roche_sandboxes{state="running"}`)
		if err := dc.ContainerKill(ctx, sb.ID, "KILL"); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "roched to stop counting it", func() bool {
			return td.tracked(sb.ID) != ledger.KindClient &&
				metricValue(td.metricsText(t), `roche_sandboxes{state="running"}`) == running-1
		})
		_, err = td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}})
		if !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "ended at") || !strings.Contains(err.Error(), "status 137") {
			t.Fatalf("exec in a sandbox killed while idle: %v, want not found saying it ended with status 137", err)
		}
		eventually(t, 10*time.Second, "the engine to finish removing it", func() bool { return td.gone(sb.ID) })
	})
}

// closeOnWrite closes ch at the first write.
type closeOnWrite struct {
	once sync.Once
	ch   chan struct{}
}

func (c *closeOnWrite) Write(b []byte) (int, error) {
	c.once.Do(func() { close(c.ch) })
	return len(b), nil
}
