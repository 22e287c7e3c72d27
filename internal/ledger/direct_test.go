package ledger

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestDirectModeSandboxes: a sandbox its user made in direct mode (owner DirectOwner) is
// served to that user (Tenant.Direct) as its own: listed with its own owner, found by id
// and by a prefix of it, run in, destroyed. Another owner's direct sandbox, the same
// tenant without Direct (another uid on the socket) and a TCP tenant are told "not
// found", and cannot destroy it. It is never written to the state file, nor counted
// against the bounds, nor destroyed by a reconcile or a restart.
func TestDirectModeSandboxes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dp := dockerProvider(t)
	owner := "cli:ledger-test-" + filepath.Base(t.TempDir()) + "@host"
	mk := func(owner string) string {
		t.Helper()
		cfg := roche.DefaultConfig()
		cfg.Image = testenv.Image()
		sb, err := kit.Create(ctx, dp, cfg, kit.CreateOptions{Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dp.Destroy(context.Background(), sb.ID) })
		return sb.ID
	}
	mine, theirs := mk(owner), mk("cli:someone-else@host")

	state := filepath.Join(t.TempDir(), "state.json")
	cfg := Config{DefaultProvider: "docker", StateFile: state, MaxSandboxes: 1, DirectOwner: owner,
		ProviderOf: func(string) string { return "docker" }}
	start := func() *Ledger {
		t.Helper()
		l, err := New(cfg, map[string]roche.Provider{"docker": dp})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close(context.Background()) })
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := start()
	me := &Tenant{Name: LocalTenant, Local: true, Direct: true}
	otherUID := &Tenant{Name: LocalTenant, Local: true}
	acme := &Tenant{Name: "acme"}

	listed := func(tn *Tenant) map[string]roche.SandboxInfo {
		t.Helper()
		list, err := l.List(ctx, tn, "")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]roche.SandboxInfo{}
		for _, sb := range list {
			out[sb.ID] = sb
		}
		return out
	}
	// Named by a prefix first: the call that finds it takes it over.
	if tg, err := l.Resolve(me, mine[:12]); err != nil || tg.ID != mine {
		t.Fatalf("resolving a prefix of its user's direct sandbox: %+v %v", tg, err)
	}
	got := listed(me)
	if sb, ok := got[mine]; !ok || sb.Owner != owner {
		t.Fatalf("its user's list: %v, want %s with owner %s", got, mine, owner)
	}
	if _, ok := got[theirs]; ok {
		t.Fatalf("its user's list holds another owner's direct sandbox %s", theirs)
	}
	for name, tn := range map[string]*Tenant{"the local tenant of another uid": otherUID, "a TCP tenant": acme} {
		if got := listed(tn); len(got) != 0 {
			t.Errorf("%s lists %v, want nothing", name, got)
		}
		for _, id := range []string{mine, mine[:12]} {
			if _, err := l.Exec(ctx, tn, id, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) {
				t.Errorf("%s running in %s: %v, want not found", name, id, err)
			}
			if _, err := l.Destroy(tn, id); !errors.Is(err, roche.ErrNotFound) {
				t.Errorf("%s destroying %s: %v, want not found", name, id, err)
			}
		}
	}
	if _, err := l.Exec(ctx, me, theirs, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "among yours") {
		t.Errorf("running in another owner's direct sandbox: %v, want not found", err)
	}
	res, err := l.Exec(ctx, me, mine, roche.ExecRequest{Cmd: []string{"echo", "hi"}})
	if err != nil || res.Stdout != "hi\n" {
		t.Fatalf("exec in its user's direct sandbox: %+v %v", res, err)
	}
	// Not roched's to count: a create is admitted at MaxSandboxes 1.
	sbCfg := roche.DefaultConfig()
	sbCfg.Image = testenv.Image()
	made, _, err := l.Create(ctx, me, "docker", sbCfg, false)
	if err != nil {
		t.Fatalf("a create with one direct sandbox served and a bound of 1: %v", err)
	}
	t.Cleanup(func() { dp.Destroy(context.Background(), made.ID) })

	// The state file holds roched's sandbox, not the CLI's.
	if err := l.save(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(state)
	if err != nil || strings.Contains(string(b), mine) || !strings.Contains(string(b), made.ID) {
		t.Fatalf("state file %s (%v): want %s and not %s", b, err, made.ID, mine)
	}
	// A reconcile and a restart leave it running, served again.
	l.reconcile(ctx, false)
	if _, err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	l = start()
	if _, err := dp.Inspect(ctx, mine); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if _, ok := listed(me)[mine]; !ok {
		t.Fatal("after a restart its user's list lacks its direct sandbox")
	}
	if full, err := l.Destroy(me, mine); err != nil || full != mine {
		t.Fatalf("its user destroying it: %q %v", full, err)
	}
	testenv.Eventually(t, time.Minute, "the destroyed direct sandbox to go", func() bool {
		_, err := dp.Inspect(ctx, mine)
		return errors.Is(err, roche.ErrNotFound)
	})
	if _, err := l.Destroy(me, made.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := dp.Inspect(ctx, theirs); err != nil {
		t.Fatalf("another owner's direct sandbox: %v, want it untouched", err)
	}
}
