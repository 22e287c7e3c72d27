package ledger

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

// localOnly is a provider whose sandboxes only its own process sees: neither a
// kit.Elector nor a kit.LeaseHolder.
type localOnly struct{ roche.Provider }

// TestGroupRefused: a replica group over a provider replicas cannot share, a malformed
// group name, and an identity without a group are each refused at New, saying what to do.
func TestGroupRefused(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{StateFile: state, Group: "g"}, "--providers=kubernetes"},
		{Config{StateFile: state, Group: "Not_A_Name"}, "lower-case letters"},
		{Config{StateFile: state, Identity: "a"}, "--replica-group"},
	} {
		_, err := New(tc.cfg, map[string]roche.Provider{"local": localOnly{}})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("New(%+v): %v, want one line saying %q", tc.cfg, err, tc.want)
		}
	}
}

// TestGroupOwners: a replica's tenants' sandboxes carry the group's owner, which every
// replica of the group (whatever its state file) takes for the group's, and no other
// group's replica or lone roched does; its pool's stay its own.
func TestGroupOwners(t *testing.T) {
	mk := func(group string) *Ledger {
		return &Ledger{cfg: Config{Group: group}, instance: newInstance(), stateKey: stateKeyOf(filepath.Join(t.TempDir(), "s.json"))}
	}
	a, b, other, lone := mk("g"), mk("g"), mk("h"), mk("")
	owner := a.ownerFor("acme")
	if owner != "roched:replicas.g/acme" {
		t.Fatalf("owner %q", owner)
	}
	if class, tenant := b.classify(owner); class != sharedOwner || tenant != "acme" {
		t.Errorf("another replica classifies %q as %v, %q", owner, class, tenant)
	}
	if class, _ := other.classify(owner); class != foreignOwner {
		t.Errorf("another group's replica classifies %q as %v", owner, class)
	}
	if class, _ := lone.classify(owner); class != foreignOwner {
		t.Errorf("a lone roched classifies %q as %v", owner, class)
	}
	if class, _ := b.classify(a.Owner()); class != foreignOwner {
		t.Errorf("a replica's pool owner %q is %v to another replica, want foreign", a.Owner(), class)
	}
}

// TestStateHoldsTheReplicasOwn: a replica's state file holds what it made, gave out or
// is destroying, not the group's sandboxes it only serves (another replica gave them
// out; a restarted replica finds them in the cluster, as any replica does); a lone
// roched's holds every record it has, adopted ones too.
func TestStateHoldsTheReplicasOwn(t *testing.T) {
	for _, group := range []string{"g", ""} {
		l := &Ledger{cfg: Config{Group: group}, sandboxes: map[string]*Record{
			"made":    {ID: "made", Kind: KindClient},
			"idle":    {ID: "idle", Kind: KindPooled},
			"served":  {ID: "served", Kind: KindClient, adopted: true},
			"reaping": {ID: "reaping", Kind: KindDestroying, adopted: true},
			"direct":  {ID: "direct", Kind: KindClient, direct: true, adopted: true},
		}}
		_, recs := l.snapshot()
		var got []string
		for _, r := range recs {
			got = append(got, r.ID)
		}
		slices.Sort(got)
		want := []string{"idle", "made", "reaping", "served"}
		if group != "" {
			want = []string{"idle", "made", "reaping"}
		}
		if !slices.Equal(got, want) {
			t.Errorf("group %q: state holds %v, want %v", group, got, want)
		}
	}
}
