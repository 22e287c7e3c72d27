package daemon

import (
	"encoding/json"
	"net/http"
	"os"

	"github.com/roche-sandbox/roche/internal/wire"
)

// healthz answers GET /healthz: roched's version and pid, the providers and how many
// sandboxes it serves, and whether each watched engine answers (the ledger checks them,
// internal/ledger health.go).
func (d *Daemon) healthz(w http.ResponseWriter, _ *http.Request) {
	n := d.ledger.Serving()
	engines, allUp := d.engineHealth()
	status := "ok"
	if !allUp {
		// roched itself answers (200), so clients keep reaching it and hear why creates fail.
		status = "degraded"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(wire.Health{
		Status: status, Version: Version, PID: os.Getpid(), StartedAt: d.started, Providers: d.ledger.Providers(), Sandboxes: n,
		Engines: engines,
	})
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
