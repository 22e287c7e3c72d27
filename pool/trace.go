package pool

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// WithTracer makes each refill batch a root span (pool.refill, docs/traces.md), with a
// pool.create span per sandbox below it; without it the pools record none, at no cost.
// A refill runs outside any call, so its span starts a trace of its own.
func WithTracer(tr trace.Tracer) Option { return func(m *Manager) { m.tracer = tr } }

// batch is one refill's span, ended when the last of its creations is done.
type batch struct {
	span trace.Span
	mu   sync.Mutex
	left int
	made int
}

// startBatch starts the span of a refill of n sandboxes; nil when tracing is off.
func (p *Pool) startBatch(n int) *batch {
	if p.m.tracer == nil {
		return nil
	}
	_, span := p.m.tracer.Start(context.Background(), "pool.refill",
		trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("roche.pool", p.spec.Key.String()),
			attribute.String("roche.provider", p.spec.Key.Provider),
			attribute.Int("roche.pool.count", n)))
	return &batch{span: span, left: n}
}

// child starts the span of one creation of the batch; end ends it and counts it in the
// batch. When tracing is off ctx is returned unchanged and end does nothing.
func (b *batch) child(ctx context.Context, tr trace.Tracer) (_ context.Context, end func(id string, err error)) {
	if b == nil {
		return ctx, func(string, error) {}
	}
	ctx = trace.ContextWithSpan(ctx, b.span)
	ctx, sp := tr.Start(ctx, "pool.create", trace.WithSpanKind(trace.SpanKindInternal))
	return ctx, func(id string, err error) {
		if id != "" {
			sp.SetAttributes(attribute.String("roche.sandbox_id", id))
		}
		if err != nil {
			sp.SetStatus(codes.Error, err.Error())
		}
		sp.End()
		b.done(err == nil && id != "")
	}
}

// done counts one creation of the batch over; the last ends the batch's span.
func (b *batch) done(made bool) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if made {
		b.made++
	}
	b.left--
	if b.left == 0 {
		b.span.SetAttributes(attribute.Int("roche.pool.made", b.made))
		if b.made == 0 {
			b.span.SetStatus(codes.Error, "no sandbox made")
		}
		b.span.End()
	}
}
