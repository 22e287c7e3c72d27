package daemon

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// TestTenantLabelsAndLifetimes: through roched, metadata selects only the caller's own
// sandboxes (a second tenant's with the same labels stays invisible), no metadata key can
// stand for Roche's owner label, and SetTimeout moves a sandbox's end within the
// tenant's max_timeout_secs, the new end being the one roched reports and reaps at.
func TestTenantLabelsAndLifetimes(t *testing.T) {
	tok := randomToken()
	td := startTenantDaemon(t, Config{Tenants: []Tenant{{Name: "acme", TokenSHA256: HashToken(tok), MaxTimeoutSecs: 60}}}, []string{"bolt"}, nil)
	td.tokens["acme"] = tok
	ctx := ctxFor(t, 3*time.Minute)
	acme, bolt := td.client(t, "acme"), td.client(t, "bolt")

	cfg := pyConfig()
	cfg.TimeoutSecs = 120
	if sb, err := acme.Create(ctx, cfg); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "tenant acme's maximum of 60 s") {
		if err == nil {
			acme.Destroy(ctx, sb.ID)
		}
		t.Fatalf("acme's create for 120 s: %v, want refused at its 60 s maximum", err)
	}

	label := map[string]string{"team": randomName("t")}
	cfg.TimeoutSecs, cfg.Metadata = 30, label
	a, err := acme.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer acme.Destroy(ctx, a.ID)
	b, err := bolt.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Destroy(ctx, b.ID)
	if !maps.Equal(a.Metadata, label) {
		t.Errorf("Create: metadata %v, want %v", a.Metadata, label)
	}
	for who, p := range map[string]struct {
		list func() ([]roche.SandboxInfo, error)
		want string
	}{
		"acme": {func() ([]roche.SandboxInfo, error) {
			return acme.ListFiltered(ctx, roche.ListFilter{Metadata: label, State: roche.StateRunning})
		}, a.ID},
		"bolt": {func() ([]roche.SandboxInfo, error) { return bolt.ListFiltered(ctx, roche.ListFilter{Metadata: label}) }, b.ID},
	} {
		list, err := p.list()
		if err != nil || len(list) != 1 || list[0].ID != p.want || !maps.Equal(list[0].Metadata, label) {
			t.Errorf("%s's list filtered on %v: %v (%v), want only %s", who, label, ids(list), err, p.want)
		}
	}
	if list, err := acme.ListFiltered(ctx, roche.ListFilter{Metadata: label, State: roche.StatePaused}); err != nil || len(list) != 0 {
		t.Errorf("acme's paused sandboxes labelled %v: %v (%v), want none", label, ids(list), err)
	}
	// The attack: bolt labels a sandbox as acme's, by the key Roche keeps the owner under.
	spoof := pyConfig()
	spoof.Metadata = map[string]string{"roche.owner": a.Owner}
	if sb, err := bolt.Create(ctx, spoof); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "Roche's own") {
		if err == nil {
			bolt.Destroy(ctx, sb.ID)
		}
		t.Fatalf("bolt's create labelled roche.owner=%s: %v, want refused", a.Owner, err)
	}

	if _, err := acme.SetTimeout(ctx, a.ID, 61*time.Second); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "maximum of 60 s") {
		t.Fatalf("acme's SetTimeout(61s): %v, want refused at its maximum", err)
	}
	if _, err := bolt.SetTimeout(ctx, a.ID, 5*time.Second); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("bolt's SetTimeout of acme's sandbox: %v, want not found", err)
	}
	asked := time.Now()
	got, err := acme.SetTimeout(ctx, a.ID, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.ExpiresAt.Sub(asked); d < time.Second || d > 4*time.Second {
		t.Errorf("SetTimeout(2s): expires %s after the call", d)
	}
	if in, err := acme.Inspect(ctx, a.ID); err != nil || !in.ExpiresAt.Equal(got.ExpiresAt) {
		t.Errorf("Inspect: expires %v (%v), want %v", in.ExpiresAt, err, got.ExpiresAt)
	}
	eventually(t, 30*time.Second, "acme's sandbox ends at its new end", func() bool { return td.gone(a.ID) })
	if el := time.Since(asked); el < time.Second {
		t.Errorf("the sandbox ended %s after SetTimeout(2s)", el)
	}
	if _, err := bolt.Inspect(ctx, b.ID); err != nil {
		t.Errorf("bolt's sandbox, untouched: %v", err)
	}
}
