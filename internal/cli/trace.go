package cli

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// withTraceparent continues the trace of the script that runs roche: the W3C
// TRACEPARENT (and TRACESTATE) of the environment, when set, becomes the span of every
// call's context, so that the client sends it to roched as the traceparent header and
// roched's spans are its children (docs/traces.md). A malformed value is warned about
// and left out: tracing never stops a command.
func withTraceparent(ctx context.Context, getenv func(string) string, log *slog.Logger) context.Context {
	tp := getenv("TRACEPARENT")
	if tp == "" {
		return ctx
	}
	carrier := propagation.MapCarrier{"traceparent": tp}
	if ts := getenv("TRACESTATE"); ts != "" {
		carrier["tracestate"] = ts
	}
	out := propagation.TraceContext{}.Extract(ctx, carrier)
	if !trace.SpanContextFromContext(out).IsValid() {
		log.Warn("TRACEPARENT is not a W3C traceparent (00-TRACEID-SPANID-FLAGS): roched's spans will not continue its trace", "traceparent", tp)
		return ctx
	}
	return out
}
