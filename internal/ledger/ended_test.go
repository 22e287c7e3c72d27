package ledger

import (
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestEventEnd: the engine's event is read into a reason by its evidence alone: an OOM
// event just before the death is oom, a death at the expiry is the lifetime, one found
// after the watch was cut off is the engine's, any other death the agent's exit, and a
// removal nobody here made is unknown, never a guess.
func TestEventEnd(t *testing.T) {
	now := time.Now()
	rec := &Record{ID: "c1", Provider: "docker", CreatedAt: now.Add(-time.Minute), ExpiresAt: now.Add(time.Hour)}
	died := kit.SandboxEvent{ID: "c1", Kind: kit.EventDied, ExitCode: 137, ExitKnown: true, Time: now}
	l := &Ledger{}

	if got := l.eventEnd(rec, died); got.Kind != roche.EndAgentExited || got.ExitCode != 137 {
		t.Errorf("a death with no OOM before it: %+v", got)
	}
	l.ended.sawOOM("c1", now.Add(-200*time.Millisecond))
	if got := l.eventEnd(rec, died); got.Kind != roche.EndOOM || got.Evidence == "" {
		t.Errorf("a death right after an OOM event: %+v", got)
	}
	late := died
	late.Time = now.Add(time.Minute) // the OOM a minute before was a command's, which the sandbox survived
	if got := l.eventEnd(rec, late); got.Kind != roche.EndAgentExited {
		t.Errorf("a death a minute after an OOM event: %+v", got)
	}
	expired := *rec
	expired.ExpiresAt = now.Add(-time.Second)
	if got := l.eventEnd(&expired, died); got.Kind != roche.EndLifetime {
		t.Errorf("a death at the expiry: %+v", got)
	}
	resync := died
	resync.ID, resync.Resync = "c2", true
	if got := l.eventEnd(&Record{ID: "c2", Provider: "docker", ExpiresAt: now.Add(time.Hour)}, resync); got.Kind != roche.EndEngineGone {
		t.Errorf("a death found after the watch was cut off: %+v", got)
	}
	removed := kit.SandboxEvent{ID: "c3", Kind: kit.EventRemoved, Time: now}
	if got := l.eventEnd(&Record{ID: "c3", ExpiresAt: now.Add(time.Hour)}, removed); got.Kind != roche.EndUnknown || got.Detail == "" {
		t.Errorf("a removal behind roched's back: %+v", got)
	}
}

// TestEndingsBounded: ends are kept for the retention and at most roche.MaxEndedKept
// at once, and a tenant sees only its own.
func TestEndingsBounded(t *testing.T) {
	e := endings{retention: time.Hour}
	for i := 0; i < roche.MaxEndedKept+10; i++ {
		e.add("a", false, false, roche.SandboxInfo{ID: "id" + time.Duration(i).String()}, roche.EndReason{Kind: roche.EndDestroyed})
	}
	if len(e.byID) != roche.MaxEndedKept || len(e.order) != roche.MaxEndedKept {
		t.Errorf("%d ends kept (%d in order), want %d", len(e.byID), len(e.order), roche.MaxEndedKept)
	}
	if _, ok := e.get(&Tenant{Name: "a"}, "id0s"); ok {
		t.Error("the oldest end outlived the bound")
	}
	last := "id" + time.Duration(roche.MaxEndedKept+9).String()
	if _, ok := e.get(&Tenant{Name: "a"}, last); !ok {
		t.Error("the newest end was forgotten")
	}
	if _, ok := e.get(&Tenant{Name: "b"}, last); ok {
		t.Error("another tenant sees the end")
	}
	e.retention = time.Nanosecond
	time.Sleep(time.Millisecond)
	if _, ok := e.get(&Tenant{Name: "a"}, last); ok || len(e.byID) != 0 {
		t.Errorf("ends outlived their retention: %d left", len(e.byID))
	}
}
