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
}

// EngineHealth is whether a provider's engine answers, since when, and if not, why.
type EngineHealth struct {
	Up    bool      `json:"up"`
	Since time.Time `json:"since"`
	Error string    `json:"error,omitempty"`
}
