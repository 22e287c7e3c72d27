package ledger

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
)

func TestMain(m *testing.M) { os.Exit(testenv.RunWithAgent(m)) }

// dockerProvider is the real Docker provider, answering, closed when the test's cleanups
// have run (cleanups registered after this call run first and may still use it).
func dockerProvider(t *testing.T) *docker.Provider {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	dp, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dp.Ping(ctx); err != nil {
		t.Fatalf("%v (the README's test command starts dockerd and builds the image)", err)
	}
	return dp
}

// TestLedgerWithoutTheEdge drives the ledger through its own API, with no listener, codec
// or client in between, over the real Docker provider: a tenant's bound and the daemon's
// hold, tenants see only their own sandboxes, and a ledger started on the same state file
// (as after a restart) serves what the last one handed out, to the same tenant, until it
// is destroyed.
func TestLedgerWithoutTheEdge(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dp := dockerProvider(t)
	var made []string
	t.Cleanup(func() {
		for _, id := range made {
			if _, err := dp.Inspect(context.Background(), id); err == nil {
				t.Errorf("sandbox %s survived", id)
				dp.Destroy(context.Background(), id)
			}
		}
	})
	cfg := Config{DefaultProvider: "docker", StateFile: filepath.Join(t.TempDir(), "state.json"), MaxSandboxes: 2}
	providers := map[string]roche.Provider{"docker": dp}
	start := func() *Ledger {
		t.Helper()
		l, err := New(cfg, providers)
		if err != nil {
			t.Fatal(err)
		}
		// Closed (again: Close is once) before the check for survivors, also on a failure.
		t.Cleanup(func() { l.Close(context.Background()) })
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	stop := func(l *Ledger) {
		t.Helper()
		if _, err := l.Close(ctx); err != nil {
			t.Fatalf("closing the ledger: %v", err)
		}
	}
	alice := &Tenant{Name: "alice", MaxSandboxes: 1}
	bob := &Tenant{Name: "bob"}
	sbCfg := roche.DefaultConfig()
	sbCfg.Image = testenv.Image()

	l := start()
	sb, pooled, err := l.Create(ctx, alice, "", sbCfg, false)
	if err != nil || pooled {
		t.Fatalf("alice's create: pooled=%v %v", pooled, err)
	}
	made = append(made, sb.ID)
	if sb.Owner != l.OwnerOf("alice") {
		t.Errorf("alice's sandbox is owned by %q, want %q", sb.Owner, l.OwnerOf("alice"))
	}
	if _, _, err := l.Create(ctx, alice, "", sbCfg, false); !errors.Is(err, roche.ErrExhausted) {
		t.Fatalf("alice's second create past her bound of 1: %v, want ErrExhausted", err)
	}
	bobs, _, err := l.Create(ctx, bob, "docker", sbCfg, false)
	if err != nil {
		t.Fatalf("bob's create: %v", err)
	}
	made = append(made, bobs.ID)
	if _, _, err := l.Create(ctx, bob, "docker", sbCfg, false); !errors.Is(err, roche.ErrExhausted) {
		t.Fatalf("a third create past the daemon's bound of 2: %v, want ErrExhausted", err)
	}
	if _, err := l.Resolve(bob, sb.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob resolving alice's sandbox: %v, want ErrNotFound", err)
	}
	if _, err := l.Destroy(bob, sb.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob destroying alice's sandbox: %v, want ErrNotFound", err)
	}
	list, err := l.List(ctx, bob, "")
	if err != nil || len(list) != 1 || list[0].ID != bobs.ID {
		t.Fatalf("bob's list: %v %v, want only %s", list, err, bobs.ID)
	}
	if _, err := l.Destroy(bob, bobs.ID); err != nil {
		t.Fatal(err)
	}
	if n := l.Serving(); n != 1 {
		t.Errorf("serving %d sandboxes after bob's destroy, want alice's 1", n)
	}
	stop(l)

	// Restarted on the same state file: alice's sandbox is hers still, and works.
	l = start()
	defer stop(l)
	r, ok := l.Tracked(sb.ID)
	if !ok || r.Kind != KindClient || r.TenantName() != "alice" {
		t.Fatalf("after the restart the record of alice's sandbox is %+v (tracked %v)", r, ok)
	}
	res, err := l.Exec(ctx, alice, sb.ID[:12], roche.ExecRequest{Cmd: []string{"echo", "kept"}})
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("exec in alice's sandbox after the restart: %q %v", res.Stdout, err)
	}
	if _, err := l.Exec(ctx, bob, sb.ID, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bob's exec in alice's sandbox after the restart: %v, want ErrNotFound", err)
	}
	if slices.ContainsFunc(l.Records(), func(r Record) bool { return r.ID == bobs.ID }) {
		t.Errorf("bob's destroyed sandbox is still recorded after the restart")
	}
	if _, err := l.Destroy(alice, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// keepHook is the Docker provider with a hook run after a pooled sandbox's lease is
// ended for the client it is handed to.
type keepHook struct {
	*docker.Provider
	kept func()
}

func (k *keepHook) Keep(ctx context.Context, id string) error {
	err := k.Provider.Keep(context.WithoutCancel(ctx), id)
	k.kept()
	return err
}

// TestPooledCreateForAGoneClient: a client whose create is cancelled just as a pooled
// sandbox is handed to it (its lease ended, the record made) would never hear of that
// sandbox; the create fails and the sandbox is destroyed, as a cold one made for a gone
// client is.
func TestPooledCreateForAGoneClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dp := dockerProvider(t)
	spec, err := pool.ParseSpec("docker/" + testenv.Image() + "?min=1")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancelCreate := context.WithCancel(ctx)
	defer cancelCreate()
	hook := &keepHook{Provider: dp, kept: cancelCreate}
	cfg := Config{DefaultProvider: "docker", StateFile: filepath.Join(t.TempDir(), "state.json"), Pools: []pool.Spec{spec}}
	l, err := New(cfg, map[string]roche.Provider{"docker": hook})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); l.Pools()[0].Status().Idle == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pool made no sandbox in a minute")
		}
	}
	var pooled string
	for _, r := range l.Records() {
		if r.Kind == KindPooled {
			pooled = r.ID
		}
	}
	if pooled == "" {
		t.Fatal("no pooled sandbox recorded")
	}
	sbCfg := roche.DefaultConfig()
	sbCfg.Image = testenv.Image()
	sb, hit, err := l.Create(cctx, &Tenant{Name: "gone"}, "", sbCfg, false)
	if err == nil {
		dp.Destroy(context.Background(), sb.ID)
		t.Fatalf("a create cancelled as the pool handed it a sandbox returned %s (pooled %v), want an error", sb.ID, hit)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("create: %v, want context.Canceled", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := dp.Inspect(ctx, pooled); errors.Is(err, roche.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pooled sandbox %s handed to the gone client still exists after 30 s", pooled)
		}
	}
}
