package daemon

import (
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"slices"

	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/doctor"
	"github.com/roche-sandbox/roche/internal/wire"
)

// healthz answers GET /healthz: roched's version and pid, the providers and how many
// sandboxes it serves, whether each watched engine answers (the ledger checks them,
// internal/ledger health.go), and which providers cannot make sandboxes, and why. It is
// "degraded" while an engine does not answer or a provider the operator asked for
// cannot make sandboxes; roched itself answers (200) either way, so that clients keep
// reaching it and hear why their creates fail.
func (d *Daemon) healthz(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("verbose") {
		d.doctor(w, r)
		return
	}
	n := d.ledger.Serving()
	engines, allUp := d.engineHealth()
	unavailable, askedMissing := d.providerHealth()
	status := "ok"
	if !allUp || askedMissing {
		status = "degraded"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(wire.Health{
		Status: status, Version: buildinfo.Version(), PID: os.Getpid(), StartedAt: d.started, Providers: d.ledger.Providers(), Sandboxes: n,
		Engines: engines, Unavailable: unavailable,
	})
}

// doctor answers GET /healthz?verbose (with a token, as the API): roche doctor's report
// (internal/doctor, the same JSON as roche doctor --json) of the providers roched serves,
// as it opened them, and of those it left out at start, and why.
func (d *Daemon) doctor(w http.ResponseWriter, r *http.Request) {
	rep := doctor.Served(r.Context(), doctor.Options{}, d.providers, d.cfg.LeftOut)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(rep)
}

// providerHealth is why each provider that cannot make sandboxes cannot: left out at
// start, or served and failing its availability check (only the cheap ones: a file or
// a setting looked at, never a cluster or hypervisor probed); and whether one of them
// is a provider the operator asked for.
func (d *Daemon) providerHealth() (map[string]string, bool) {
	out := map[string]string{}
	for name, err := range d.cfg.LeftOut {
		out[name] = "not served: " + err.Error()
	}
	for name, p := range d.providers {
		info, err := catalog.Lookup(name)
		if err != nil || !info.CheckAtStart {
			continue
		}
		if a, ok := p.(interface{ Available() error }); ok {
			if err := a.Available(); err != nil {
				out[name] = err.Error()
			}
		}
	}
	if len(out) == 0 {
		return nil, false
	}
	asked := slices.Clone(d.cfg.Asked)
	for _, s := range d.cfg.Pools {
		asked = append(asked, s.Provider)
	}
	for _, name := range slices.Sorted(maps.Keys(out)) {
		if slices.Contains(asked, name) {
			return out, true
		}
	}
	return out, false
}

// engineHealth is the engines' part of /healthz, and whether every one is up.
func (d *Daemon) engineHealth() (map[string]wire.EngineHealth, bool) {
	snap := d.ledger.Engines()
	if len(snap) == 0 {
		return nil, true
	}
	out := make(map[string]wire.EngineHealth, len(snap))
	allUp := true
	for name, st := range snap {
		h := wire.EngineHealth{Up: st.Up, Since: st.Since}
		if !st.Up && st.Err != nil {
			h.Error = st.Err.Error()
		}
		allUp = allUp && st.Up
		out[name] = h
	}
	return out, allUp
}
