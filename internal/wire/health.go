package wire

import "time"

// Health is what roched's GET /healthz answers, in JSON: the daemon writes it and the
// Go client (client.Health) reads it, so the one type serves both.
type Health struct {
	Status    string    `json:"status"`
	Version   string    `json:"version"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	Providers []string  `json:"providers"`
	// Sandboxes is how many sandboxes are handed to clients.
	Sandboxes int `json:"sandboxes"`
	// Engines says, for each provider whose engine the daemon watches (docker), whether
	// it answers; Status is "degraded" while one does not, and creates for that provider
	// are refused.
	Engines map[string]EngineHealth `json:"engines,omitempty"`
	// Unavailable says, for each provider that cannot make sandboxes now, why (its
	// creates fail with that reason): one left out at start, or served without what it
	// needs (wasm without python.wasm, kubernetes without a cluster). Status is
	// "degraded" while one the operator asked for (roched --providers, or a pool's) is
	// among them.
	Unavailable map[string]string `json:"unavailable,omitempty"`
}

// EngineHealth is whether a provider's engine answers, since when, and if not, why.
type EngineHealth struct {
	Up    bool      `json:"up"`
	Since time.Time `json:"since"`
	Error string    `json:"error,omitempty"`
}
