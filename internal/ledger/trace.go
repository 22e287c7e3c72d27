package ledger

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// WithTracer makes the ledger record spans (pool claim, provider create, exec, run_code)
// with tr, under the caller's span; without it the ledger records none, at no cost.
func WithTracer(tr trace.Tracer) Option { return func(l *Ledger) { l.tracer = tr } }

// span starts a child span of ctx's named name when tracing is on; otherwise it returns
// ctx and its span (the no-op one) unchanged, allocating nothing.
func (l *Ledger) span(ctx context.Context, name, provider, id string) (context.Context, trace.Span) {
	if l.tracer == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx, sp := l.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	if provider != "" {
		sp.SetAttributes(attribute.String("roche.provider", provider))
	}
	if id != "" {
		sp.SetAttributes(attribute.String("roche.sandbox_id", id))
	}
	return ctx, sp
}

// endSpan ends a span l.span started (and nothing when tracing is off: the span is the
// caller's, which is not ours to end).
func (l *Ledger) endSpan(sp trace.Span, err error) {
	if l.tracer == nil {
		return
	}
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
