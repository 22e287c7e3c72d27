package guestfwd

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/roche-sandbox/roche/internal/guest"
)

// agentScope names the agent's spans' instrumentation scope.
const agentScope = "github.com/roche-sandbox/roche/roche-agent"

// traceParent is the W3C traceparent of ctx's span (provider.exec, provider.run_code)
// when it is recorded: the agent then records its own spans of the request and sends
// them with its result. With tracing off there is no such span, nothing is asked and
// nothing comes back.
func traceParent(ctx context.Context) string {
	sp := trace.SpanFromContext(ctx)
	sc := sp.SpanContext()
	if !sc.IsValid() || !sc.IsSampled() || !sp.IsRecording() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// agentSpans passes the spans the agent recorded to the exporter of ctx's span (roched's:
// the agent has no network), below that span, as the agent timed them.
func agentSpans(ctx context.Context, spans []guest.Span) {
	if len(spans) == 0 {
		return
	}
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return
	}
	tr := parent.TracerProvider().Tracer(agentScope)
	below := map[string]context.Context{}
	type open struct {
		sp  trace.Span
		end int64
	}
	var started []open
	for _, s := range spans {
		pctx, ok := below[s.Parent]
		if !ok {
			pctx = ctx
		}
		attrs := []attribute.KeyValue{attribute.String("roche.component", "roche-agent")}
		for k, v := range s.Attrs {
			switch v := v.(type) {
			case float64: // JSON numbers
				attrs = append(attrs, attribute.Int64(k, int64(v)))
			case bool:
				attrs = append(attrs, attribute.Bool(k, v))
			case string:
				attrs = append(attrs, attribute.String(k, v))
			}
		}
		sctx, sp := tr.Start(pctx, s.Name, trace.WithTimestamp(time.Unix(0, s.StartNS)),
			trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
		if s.Error != "" {
			sp.SetStatus(codes.Error, s.Error)
		}
		below[s.ID] = sctx
		started = append(started, open{sp, s.EndNS})
	}
	for i := len(started) - 1; i >= 0; i-- {
		started[i].sp.End(trace.WithTimestamp(time.Unix(0, started[i].end)))
	}
}
