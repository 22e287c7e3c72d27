package ledger

import (
	"context"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// watchLister is the little of a kit.WatchLister a reconciliation's read asks: its
// list, counted, and its watch's view.
type watchLister struct {
	roche.Provider
	listed  []roche.SandboxInfo
	view    []roche.SandboxInfo
	synced  bool
	listing int
}

func (p *watchLister) List(context.Context) ([]roche.SandboxInfo, error) {
	p.listing++
	return p.listed, nil
}

func (p *watchLister) Watch(context.Context) (<-chan kit.SandboxEvent, error) { return nil, nil }

func (p *watchLister) Watched() ([]roche.SandboxInfo, bool) { return p.view, p.synced }

// TestReconcileReadsTheWatch: a reconciliation reads the provider's watch instead of
// listing while the watch's view holds every sandbox tracked before the read, and lists
// at start-up, when the view lacks one (gone, or not in the view yet: only a list tells),
// when the watch is not synced, and every watchResync.
func TestReconcileReadsTheWatch(t *testing.T) {
	p := &watchLister{synced: true}
	l := &Ledger{providers: map[string]roche.Provider{"k": p}, names: []string{"k"},
		sandboxes: map[string]*Record{}, listedAt: map[string]time.Time{}}
	ctx := context.Background()
	a, b := roche.SandboxInfo{ID: "a"}, roche.SandboxInfo{ID: "b"}
	p.listed, p.view = []roche.SandboxInfo{a, b}, []roche.SandboxInfo{a}
	now := time.Now()
	l.sandboxes["a"] = &Record{ID: "a", Provider: "k", since: now.Add(-time.Minute)}
	// A record of another provider's is not this one's to look for.
	l.sandboxes["x"] = &Record{ID: "x", Provider: "other", since: now.Add(-time.Minute)}

	read := func(startup bool, want []roche.SandboxInfo, listing int) {
		t.Helper()
		before := p.listing
		got, at, err := l.sandboxesOf(ctx, "k", startup)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || time.Since(at) > time.Minute {
			t.Errorf("read %v at %v, want %v", got, at, want)
		}
		if n := p.listing - before; n != listing {
			t.Errorf("%d lists, want %d", n, listing)
		}
	}
	read(true, p.listed, 1) // start-up
	read(false, p.view, 0)  // every tracked sandbox in the view
	read(false, p.view, 0)
	// The watch broke and has not listed again.
	p.synced = false
	read(false, p.listed, 1)
	p.synced = true
	// b tracked, not in the view: a list says whether it went.
	l.sandboxes["b"] = &Record{ID: "b", Provider: "k", since: now.Add(-time.Second)}
	read(false, p.listed, 1)
	// Made after the read: the next reconciliation's to look for.
	l.sandboxes["b"].since = time.Now().Add(time.Hour)
	read(false, p.view, 0)
	// A check on the view every watchResync.
	l.listedAt["k"] = time.Now().Add(-watchResync - time.Second)
	read(false, p.listed, 1)
	read(false, p.view, 0)
}
