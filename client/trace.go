package client

import (
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceparent sends the W3C traceparent (and tracestate) of the request's context, when
// it holds a span (OpenTelemetry's, or one put there with trace.ContextWithSpanContext),
// so that roched's spans for the call are its children (docs/traces.md). A context
// without one sends nothing more.
type traceparent struct {
	next http.RoundTripper
}

func (t traceparent) RoundTrip(r *http.Request) (*http.Response, error) {
	if sc := trace.SpanContextFromContext(r.Context()); sc.IsValid() {
		r = r.Clone(r.Context()) // a RoundTripper must not change its caller's request
		propagation.TraceContext{}.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
	}
	return t.next.RoundTrip(r)
}
