package ledger

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Why sandboxes ended: every end of a client's sandbox the daemon sees is recorded with
// a typed reason (roche.EndReason) and its evidence, kept for Config.EndedRetention
// (bounded to roche.MaxEndedKept, the oldest forgotten first) so that Inspect answers
// for a sandbox that ended, and the Hold stream, the log and the metrics say why.

// EndObserver is an Observer that also counts ended sandboxes by reason (the edge's
// metrics). Found by type assertion, so Observers without it still serve.
type EndObserver interface {
	Ended(kind roche.EndKind)
}

// endings remembers why client sandboxes ended.
type endings struct {
	mu        sync.Mutex
	retention time.Duration
	byID      map[string]ending
	order     []string
	// oom is when the engine last reported an OOM kill in each sandbox (kit.EventOOM),
	// which its end may then be; bounded as the endings are.
	oom      map[string]time.Time
	oomOrder []string
}

type ending struct {
	tenant string
	direct bool // a direct-mode sandbox, whose end only its user hears of (direct.go)
	// behindBack: it ended without the daemon ending it (killed, stopped by its engine),
	// which a call naming it afterwards hears as the reason it is gone.
	behindBack bool
	info       roche.SandboxInfo
	reason     roche.EndReason
	recorded   time.Time
}

// endRecord says what add did with an end.
type endRecord int

const (
	endKept     endRecord = iota // one was recorded already: kept
	endFirst                     // the first of this sandbox: recorded
	endImproved                  // an unknown one recorded before: replaced by this known one
)

// add records why sandbox info.ID ended. A reason already recorded is kept, unless it
// was unknown and this one is not.
func (e *endings) add(tenant string, direct, behindBack bool, info roche.SandboxInfo, why roche.EndReason) endRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.byID == nil {
		e.byID = map[string]ending{}
	}
	id := info.ID
	did := endFirst
	if old, ok := e.byID[id]; ok {
		if old.reason.Kind != roche.EndUnknown || why.Kind == roche.EndUnknown {
			return endKept
		}
		did = endImproved
	} else {
		e.order = append(e.order, id)
	}
	info.State = roche.StateExited
	e.byID[id] = ending{tenant: tenant, direct: direct, behindBack: behindBack, info: info, reason: why, recorded: time.Now()}
	e.pruneLocked(time.Now())
	return did
}

// improve replaces an unknown reason recorded for id with why, when why is known.
func (e *endings) improve(id string, why roche.EndReason) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if old, ok := e.byID[id]; ok && old.reason.Kind == roche.EndUnknown && why.Kind != roche.EndUnknown {
		old.reason = why
		e.byID[id] = old
	}
}

// unknown returns the last description of sandbox id when its end is recorded as
// unknown, which its engine's event may yet tell.
func (e *endings) unknown(id string) (roche.SandboxInfo, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en, ok := e.byID[id]
	return en.info, ok && en.reason.Kind == roche.EndUnknown
}

// pruneLocked forgets ends older than the retention and the oldest past the bound.
func (e *endings) pruneLocked(now time.Time) {
	keep := e.retention
	if keep <= 0 {
		keep = roche.DefaultEndedRetention
	}
	for len(e.order) > 0 {
		id := e.order[0]
		en, ok := e.byID[id]
		if ok && len(e.order) <= roche.MaxEndedKept && now.Sub(en.recorded) < keep {
			break
		}
		delete(e.byID, id)
		e.order = e.order[1:]
	}
}

// sawOOM remembers the engine's report of an OOM kill in sandbox id.
func (e *endings) sawOOM(id string, at time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.oom == nil {
		e.oom = map[string]time.Time{}
	}
	if _, ok := e.oom[id]; !ok {
		e.oomOrder = append(e.oomOrder, id)
	}
	e.oom[id] = at
	for len(e.oomOrder) > roche.MaxEndedKept {
		delete(e.oom, e.oomOrder[0])
		e.oomOrder = e.oomOrder[1:]
	}
}

func (e *endings) lastOOM(id string) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.oom[id]
	return t, ok
}

// get returns what is remembered of the end of tenant t's sandbox id (a full id, or a
// unique prefix of at least 4 characters).
func (e *endings) get(t *Tenant, id string) (ending, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pruneLocked(time.Now())
	mine := func(en ending) bool { return en.tenant == t.Name && (!en.direct || t.Direct) }
	if en, ok := e.byID[id]; ok {
		return en, mine(en)
	}
	if len(id) < 4 {
		return ending{}, false
	}
	var found ending
	n := 0
	for full, en := range e.byID {
		if strings.HasPrefix(full, id) && mine(en) {
			found = en
			n++
		}
	}
	return found, n == 1
}

// notFound is the error for tenant t's call naming id, which the daemon does not (or no
// longer) track: why it ended, when it ended behind the daemon's back, else plain "not
// found". Only the sandbox's own tenant hears why.
func (e *endings) notFound(t *Tenant, id string) error {
	en, ok := e.get(t, id)
	if !ok || !en.behindBack {
		return NotFound(id)
	}
	return fmt.Errorf("%w: sandbox %s ended at %s: %s (listing your sandboxes shows the live ones; inspecting it shows why it ended)",
		roche.ErrNotFound, id, en.reason.At.Local().Format(time.TimeOnly), en.reason.Detail)
}

// infoOf is what Inspect says of a record's sandbox once it has ended.
func (l *Ledger) infoOf(r *Record) roche.SandboxInfo {
	info := roche.SandboxInfo{ID: r.ID, Provider: r.Provider, Image: r.Image, State: roche.StateExited,
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt}
	if r.direct {
		info.Owner = r.owner
	} else {
		info.Owner = l.ownerFor(r.TenantName())
	}
	return info
}

// recordEnd records why the sandbox of record r ended, logs it and counts it. It takes
// the endings' lock, not l.mu, so callers may hold l.mu.
//
// Several things may see one end, in any order: the engine's event, a command that found
// the sandbox gone, a reconciliation that found it stopped or gone (in a list, or in what
// a provider's watch holds), a destroy. Each records what it knows; the first is the
// sandbox's one "sandbox ended" line and its one count in the metrics, and a known reason
// coming after an unknown one replaces it for Inspect without being counted again.
func (l *Ledger) recordEnd(r *Record, why roche.EndReason, behindBack bool) {
	if r.Kind == KindPooled {
		return // nobody's: no client asks
	}
	if why.At.IsZero() {
		why.At = time.Now()
	}
	switch l.ended.add(r.TenantName(), r.direct, behindBack, l.infoOf(r), why) {
	case endFirst:
		l.log.Info("sandbox ended", "id", r.ID, "provider", r.Provider, "tenant", r.TenantName(),
			"end", string(why.Kind), "detail", why.Detail, "evidence", why.Evidence, "by", why.By)
		if o, ok := l.obs.(EndObserver); ok {
			o.Ended(why.Kind)
		}
	case endImproved:
		l.log.Debug("sandbox's end told after it was recorded as unknown", "id", r.ID, "provider", r.Provider,
			"end", string(why.Kind), "detail", why.Detail, "evidence", why.Evidence)
	}
}

// eventEnd reads why a sandbox ended from its engine's event: an OOM kill the engine
// reported just before (containerd reads it from the cgroup's memory.events oom_kill),
// its lifetime (roche-agent stops the sandbox at its end), its engine's connection lost
// meanwhile, or its main process's exit.
func (l *Ledger) eventEnd(r *Record, ev kit.SandboxEvent) roche.EndReason {
	at := ev.Time
	if at.IsZero() {
		at = time.Now()
	}
	why := roche.EndReason{At: at, ExitCode: ev.ExitCode, ExitKnown: ev.ExitKnown}
	exit := "exit status unknown"
	if ev.ExitKnown {
		exit = fmt.Sprintf("exit %d", ev.ExitCode)
	}
	oomAt, oom := l.ended.lastOOM(ev.ID)
	switch {
	case !r.ExpiresAt.IsZero() && !at.Before(r.ExpiresAt.Add(-time.Second)):
		why.Kind = roche.EndLifetime
		why.Detail = fmt.Sprintf("its lifetime ended at %s", r.ExpiresAt.Local().Format(time.TimeOnly))
		why.Evidence = fmt.Sprintf("expires_at %s; %s engine event %s at %s (%s)", r.ExpiresAt.Local().Format(time.TimeOnly),
			r.Provider, ev.Kind, at.Local().Format("15:04:05.000"), exit)
	case ev.Kind == kit.EventDied && oom && !oomAt.Before(r.CreatedAt) && at.Sub(oomAt) < oomThenDied:
		why.Kind = roche.EndOOM
		why.Detail = "killed for exceeding its memory limit"
		why.Evidence = fmt.Sprintf("%s engine event oom at %s (its cgroup's memory.events oom_kill), then died with %s",
			r.Provider, oomAt.Local().Format("15:04:05.000"), exit)
	case ev.Resync:
		why.Kind = roche.EndEngineGone
		why.Detail = "its engine went away or restarted: " + ev.Reason()
		why.Evidence = fmt.Sprintf("the watch of the %s engine was cut off, and the sandbox was found %s afterwards (%s)", r.Provider, ev.Kind, exit)
	case ev.Kind == kit.EventDied:
		why.Kind = roche.EndAgentExited
		why.Detail = ev.Reason()
		why.Evidence = fmt.Sprintf("%s engine event died at %s (%s), no oom event before it", r.Provider, at.Local().Format("15:04:05.000"), exit)
	default:
		why = roche.UnknownEnd(at, "it was removed behind roched's back (not through roched: the engine's own tools, or another program), which the engine does not say who did")
		why.Evidence = fmt.Sprintf("%s engine event %s", r.Provider, ev.Kind)
	}
	if ev.Evidence != "" {
		why.Evidence += "; " + ev.Evidence
	}
	return why
}

// oomThenDied is how soon after the engine's OOM event a death counts as that OOM's: a
// sandbox whose main process the OOM killer takes dies at once, while one that lives on
// after a command's OOM kill (roche-agent makes commands the killer's first choice) and
// dies later died of something else.
const oomThenDied = 2 * time.Second

// InspectEnded returns the sandbox of tenant t that id names, if it ended within the
// retention: its last description, with why it ended.
func (l *Ledger) InspectEnded(t *Tenant, id string) (roche.SandboxInfo, bool) {
	en, ok := l.ended.get(t, id)
	if !ok {
		return roche.SandboxInfo{}, false
	}
	info := en.info
	why := en.reason
	info.End = &why
	return info, true
}

// Ended returns tenant t's sandboxes that ended within the retention, newest first, each
// with why it ended.
func (l *Ledger) Ended(t *Tenant) []roche.SandboxInfo {
	e := &l.ended
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pruneLocked(time.Now())
	var out []roche.SandboxInfo
	for i := len(e.order) - 1; i >= 0; i-- {
		en, ok := e.byID[e.order[i]]
		if !ok || en.tenant != t.Name || en.direct && !t.Direct {
			continue
		}
		info, why := en.info, en.reason
		info.End = &why
		out = append(out, info)
	}
	return out
}
