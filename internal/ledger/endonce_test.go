package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// endsProvider is the little of a watched provider (kit.WatchLister) that the ways a
// ledger hears of an end ask: its list, what its watch holds, and a destroy.
type endsProvider struct {
	roche.Provider
	mu     sync.Mutex
	listed []roche.SandboxInfo
	view   []roche.SandboxInfo
}

func (p *endsProvider) Name() string { return "k" }

func (p *endsProvider) List(context.Context) ([]roche.SandboxInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.listed), nil
}

func (p *endsProvider) Watch(context.Context) (<-chan kit.SandboxEvent, error) { return nil, nil }

func (p *endsProvider) Watched() ([]roche.SandboxInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.view), true
}

func (p *endsProvider) Destroy(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	drop := func(sbs []roche.SandboxInfo) []roche.SandboxInfo {
		return slices.DeleteFunc(sbs, func(sb roche.SandboxInfo) bool { return sb.ID == id })
	}
	p.listed, p.view = drop(p.listed), drop(p.view)
	return nil
}

// endCounter counts the ends the ledger reports, as roched's metrics do.
type endCounter struct {
	noObserver
	mu    sync.Mutex
	kinds []roche.EndKind
}

func (c *endCounter) Ended(kind roche.EndKind) {
	c.mu.Lock()
	c.kinds = append(c.kinds, kind)
	c.mu.Unlock()
}

// TestEndRecordedOnce: one sandbox's end reaches the ledger by up to four ways, in any
// order: its engine's events (an OOM kill, then its death), a command that found it gone,
// a reconciliation that read it stopped (from what the provider's watch holds, which
// shows the death before the event reaches the ledger), and one that found it gone from
// a list. Whatever the order, it is one end in the metrics and the log, the first one
// recorded, and Inspect says oom once the event has come. The order that counted two
// (an unknown end recorded while the record was still a client's, then the event) is
// among them.
func TestEndRecordedOnce(t *testing.T) {
	const id = "k-1"
	tenant := &Tenant{Name: "acme"}
	type step struct {
		name string
		do   func(t *testing.T, l *Ledger, p *endsProvider)
	}
	t0 := time.Now()
	event := step{"event", func(t *testing.T, l *Ledger, p *endsProvider) {
		l.sandboxEvent("k", kit.SandboxEvent{ID: id, Kind: kit.EventOOM, Time: t0})
		l.sandboxEvent("k", kit.SandboxEvent{ID: id, Kind: kit.EventDied, Time: t0.Add(100 * time.Millisecond), ExitCode: 137, ExitKnown: true})
	}}
	command := step{"command", func(t *testing.T, l *Ledger, p *endsProvider) {
		l.forgetEnded(id, fmt.Errorf("%w: sandbox %s is gone", roche.ErrNotFound, id))
	}}
	stopped := roche.SandboxInfo{ID: id, Provider: "k", State: roche.StateExited}
	view := step{"view", func(t *testing.T, l *Ledger, p *endsProvider) {
		p.mu.Lock()
		p.view, p.listed = []roche.SandboxInfo{stopped}, []roche.SandboxInfo{stopped}
		p.mu.Unlock()
		l.reconcile(context.Background(), false)
	}}
	list := step{"list", func(t *testing.T, l *Ledger, p *endsProvider) {
		p.mu.Lock()
		p.view, p.listed = nil, nil
		p.mu.Unlock()
		l.reconcile(context.Background(), false)
	}}
	// The interleaving a command's end had with the event before its record was marked
	// destroying in the same breath: unknown recorded, the record still a client's.
	unknownFirst := step{"unknown-then-event", func(t *testing.T, l *Ledger, p *endsProvider) {
		l.mu.Lock()
		l.recordEnd(l.sandboxes[id], roche.UnknownEnd(time.Now(), "a command found it gone"), true)
		l.mu.Unlock()
		event.do(t, l, p)
	}}
	orders := [][]step{
		{event, command}, {command, event},
		{view, event}, {event, view}, {view, command, event}, {command, view, event},
		{list, event}, {event, list}, {view, list, event}, {command, list, event},
		{unknownFirst}, {unknownFirst, command, view, list},
	}
	for _, order := range orders {
		var names []string
		for _, s := range order {
			names = append(names, s.name)
		}
		t.Run(strings.Join(names, ","), func(t *testing.T) {
			running := roche.SandboxInfo{ID: id, Provider: "k", State: roche.StateRunning}
			p := &endsProvider{listed: []roche.SandboxInfo{running}, view: []roche.SandboxInfo{running}}
			obs := &endCounter{}
			l, err := New(Config{StateFile: filepath.Join(t.TempDir(), "state.json")}, map[string]roche.Provider{"k": p}, WithObserver(obs))
			if err != nil {
				t.Fatal(err)
			}
			l.listedAt["k"] = time.Now() // listed a moment ago: the view is fresh
			l.sandboxes[id] = &Record{ID: id, Provider: "k", Kind: KindClient, Tenant: tenant.Name,
				CreatedAt: t0.Add(-time.Minute), ExpiresAt: t0.Add(time.Hour), since: t0.Add(-time.Minute)}
			for _, s := range order {
				s.do(t, l, p)
			}
			l.removals.Wait()

			obs.mu.Lock()
			counted := slices.Clone(obs.kinds)
			obs.mu.Unlock()
			if len(counted) != 1 {
				t.Errorf("ends counted: %v, want one", counted)
			}
			got, ok := l.InspectEnded(tenant, id)
			switch {
			case !ok:
				t.Error("no end recorded")
			case got.End.Kind != roche.EndOOM:
				t.Errorf("end recorded as %s (%s), want oom from the event", got.End.Kind, got.End.Detail)
			}
			if _, tracked := l.Tracked(id); tracked {
				t.Error("still tracked after its end")
			}
		})
	}
}
