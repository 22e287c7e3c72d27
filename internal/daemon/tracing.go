package daemon

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/buildinfo"
)

// Tracing (docs/traces.md): off unless an OTLP endpoint is configured. When off no
// interceptor is installed and the ledger's spans are the no-op kind, so a call costs
// nothing more than before. When on, every API call is a server span, its parent the
// caller's W3C traceparent header when it sends one, with the ledger's spans (pool
// claim, provider create, exec, copy, destroy) below it, exported over OTLP/HTTP
// (protobuf) in batches.

// OTLPEndpoint resolves where traces go: flag (--otlp-endpoint) first, then the standard
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the full URL), then OTEL_EXPORTER_OTLP_ENDPOINT (a
// base URL, to which /v1/traces is added). Empty means tracing is off.
func OTLPEndpoint(flag string) string {
	if flag != "" {
		return flag
	}
	if u := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); u != "" {
		return u
	}
	if u := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT"); u != "" {
		return strings.TrimSuffix(u, "/") + "/v1/traces"
	}
	return ""
}

// checkOTLPEndpoint refuses what the exporter could not send to.
func checkOTLPEndpoint(u string) error {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return fmt.Errorf("%w: OTLP endpoint %q: give an http:// or https:// URL such as http://127.0.0.1:4318/v1/traces",
			roche.ErrInvalidConfig, u)
	}
	return nil
}

// newTracerProvider makes the exporting tracer provider for endpoint.
func newTracerProvider(ctx context.Context, endpoint string) (*sdktrace.TracerProvider, error) {
	if err := checkOTLPEndpoint(endpoint); err != nil {
		return nil, err
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("%w: OTLP endpoint %q: %v", roche.ErrInvalidConfig, endpoint, err)
	}
	res := resource.NewSchemaless(
		attribute.String("service.name", "roched"),
		attribute.String("service.version", buildinfo.Version()),
	)
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// tracingInterceptor makes each API call a server span, child of the caller's
// traceparent when it sent one.
type tracingInterceptor struct {
	tr trace.Tracer
}

// tracerName names roched's spans' instrumentation scope.
const tracerName = "github.com/roche-sandbox/roche/roched"

var traceContext = propagation.TraceContext{}

func (t tracingInterceptor) start(ctx context.Context, procedure string, h propagation.HeaderCarrier) (context.Context, trace.Span) {
	ctx = traceContext.Extract(ctx, h)
	name := strings.TrimPrefix(procedure, "/")
	service, method, _ := strings.Cut(name, "/")
	ctx, span := t.tr.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
	span.SetAttributes(attribute.String("rpc.system", "connect_rpc"),
		attribute.String("rpc.service", service), attribute.String("rpc.method", method))
	if tn, err := tenantOf(ctx); err == nil {
		span.SetAttributes(attribute.String("roche.tenant", tn.Name))
	}
	return ctx, span
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, connect.CodeOf(err).String())
	}
	span.End()
}

// annotate adds what a request or response names: the sandbox and the provider. Never a
// command, its env, a file's content or a token.
func annotate(span trace.Span, msg any) {
	switch m := msg.(type) {
	case *rochev1.CreateRequest:
		if m.Provider != "" {
			span.SetAttributes(attribute.String("roche.provider", m.Provider))
		}
		return
	case *rochev1.CreateResponse:
		if sb := m.GetSandbox(); sb != nil {
			span.SetAttributes(attribute.String("roche.sandbox_id", sb.Id), attribute.String("roche.provider", sb.Provider))
		}
		span.SetAttributes(attribute.Bool("roche.pooled", m.Pooled))
		return
	case *rochev1.DestroyRequest:
		if len(m.Ids) > 0 {
			span.SetAttributes(attribute.StringSlice("roche.sandbox_ids", m.Ids))
		}
		return
	}
	if m, ok := msg.(interface{ GetSandboxId() string }); ok && m.GetSandboxId() != "" {
		span.SetAttributes(attribute.String("roche.sandbox_id", m.GetSandboxId()))
	}
}

func (t tracingInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, span := t.start(ctx, req.Spec().Procedure, propagation.HeaderCarrier(req.Header()))
		annotate(span, req.Any())
		resp, err := next(ctx, req)
		if err == nil && resp != nil {
			annotate(span, resp.Any())
		}
		endSpan(span, err)
		return resp, err
	}
}

func (tracingInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (t tracingInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, span := t.start(ctx, conn.Spec().Procedure, propagation.HeaderCarrier(conn.RequestHeader()))
		err := next(ctx, &tracedConn{StreamingHandlerConn: conn, span: span})
		endSpan(span, err)
		return err
	}
}

// tracedConn annotates the span with the stream's first message (the sandbox it names).
type tracedConn struct {
	connect.StreamingHandlerConn
	span trace.Span
	seen bool
}

func (c *tracedConn) Receive(m any) error {
	err := c.StreamingHandlerConn.Receive(m)
	if err == nil && !c.seen {
		c.seen = true
		annotate(c.span, m)
	}
	return err
}
