package guest

// Agent spans (docs/traces.md). A request that carries TraceParent (exec, code_run) asks
// the agent to record its own spans of it and send them back with the result; the agent
// has no network, so the host passes them on to its exporter. A request without one
// costs nothing: no span is recorded or sent. An agent from before spans ignores the
// field and sends none.

// Span is one span the agent recorded.
type Span struct {
	// ID is the agent's 16-hex-digit id of the span; Parent is the span it is below:
	// another of its spans, or the span of the request's TraceParent.
	ID     string `json:"id"`
	Parent string `json:"parent"`
	Name   string `json:"name"`
	// StartNS and EndNS are unix nanoseconds, by the sandbox's clock.
	StartNS int64 `json:"start_ns"`
	EndNS   int64 `json:"end_ns"`
	// Attrs are the span's attributes: numbers and short strings, never a command, its
	// arguments, an env value or output.
	Attrs map[string]any `json:"attrs,omitempty"`
	// Error, when set, makes the span's status Error with this description.
	Error string `json:"error,omitempty"`
}

// ParentSpanID is the parent span id of a W3C traceparent ("00-TRACE-SPAN-FLAGS"), ""
// when it is not one.
func ParentSpanID(traceparent string) string {
	if len(traceparent) != 55 || traceparent[2] != '-' || traceparent[35] != '-' || traceparent[52] != '-' {
		return ""
	}
	id := traceparent[36:52]
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return ""
		}
	}
	if id == "0000000000000000" {
		return ""
	}
	return id
}
