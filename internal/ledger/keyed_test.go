package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// creatingProvider makes sandboxes; during each create the client goes away (gone).
type creatingProvider struct {
	endsProvider
	gone      func()
	made      int
	destroyed []string
}

func (p *creatingProvider) Capabilities() roche.Capabilities { return roche.Capabilities{} }

func (p *creatingProvider) CreateFor(_ context.Context, cfg roche.Config, _ kit.CreateOptions) (roche.SandboxInfo, error) {
	p.gone()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.made++
	sb := roche.SandboxInfo{ID: fmt.Sprintf("k-%d", p.made), Provider: "k", Image: cfg.Image, State: roche.StateRunning,
		CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
	p.listed = append(p.listed, sb)
	return sb, nil
}

func (p *creatingProvider) Destroy(ctx context.Context, id string) error {
	p.mu.Lock()
	p.destroyed = append(p.destroyed, id)
	p.mu.Unlock()
	return p.endsProvider.Destroy(ctx, id)
}

// TestKeyedCreateOutlivesItsClient: a create whose client went away while it ran is
// destroyed (nobody will hear of its sandbox), unless it carries an idempotency key: its
// client asks again with the key, here or through another replica of a group, and must
// be answered with a sandbox that lives, not one being destroyed under it.
func TestKeyedCreateOutlivesItsClient(t *testing.T) {
	tenant := &Tenant{Name: "acme"}
	cfg := roche.DefaultConfig()
	cfg.Image = "img"
	for _, key := range []string{"", "sdk-1"} {
		ctx, cancel := context.WithCancel(context.Background())
		p := &creatingProvider{gone: cancel}
		l, err := New(Config{StateFile: filepath.Join(t.TempDir(), "state.json")}, map[string]roche.Provider{"k": p})
		if err != nil {
			t.Fatal(err)
		}
		l.recovered = true
		sb, _, err := l.CreateKeyed(ctx, tenant, "k", cfg, false, key)
		if key == "" {
			if err == nil {
				t.Errorf("an unkeyed create whose client went away answered %+v", sb)
			}
			l.removals.Wait()
			if !slices.Equal(p.destroyed, []string{"k-1"}) {
				t.Errorf("an unkeyed create's sandbox, its client gone: destroyed %v, want k-1", p.destroyed)
			}
			continue
		}
		p.gone = func() {}
		again, _, err := l.CreateKeyed(context.Background(), tenant, "k", cfg, false, key)
		if err != nil || again.ID != "k-1" {
			t.Errorf("the keyed create asked again: %+v %v, want sandbox k-1", again, err)
		}
		l.removals.Wait()
		if _, tracked := l.Tracked("k-1"); !tracked || len(p.destroyed) != 0 || p.made != 1 {
			t.Errorf("a keyed create's sandbox, its client gone: tracked %v, destroyed %v, %d made; want it kept, once", tracked, p.destroyed, p.made)
		}
	}
}
