package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// otlpReceiver is an OTLP/HTTP traces receiver on 127.0.0.1: it decodes each export
// with the OTLP protobuf module and keeps its spans.
type otlpReceiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	requests int
	spans    []*tracepb.Span
	resAttrs []*commonpb.KeyValue
	bad      []string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.requests++
		var ex coltracepb.ExportTraceServiceRequest
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
			r.bad = append(r.bad, req.Method+" "+req.URL.Path+" "+req.Header.Get("Content-Type"))
		} else if err := proto.Unmarshal(body, &ex); err != nil {
			r.bad = append(r.bad, "undecodable export: "+err.Error())
		}
		for _, rs := range ex.ResourceSpans {
			r.resAttrs = append(r.resAttrs, rs.GetResource().GetAttributes()...)
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// startTracedRoched runs the test binary as roched, a real process, listening on TCP
// with a token, its environment without any OTEL_ variable but those given.
func startTracedRoched(t *testing.T, token string, env ...string) (r *roched, socket, addr string) {
	t.Helper()
	return startTracedRochedArgs(t, token, nil, env...)
}

// startTracedRochedArgs is startTracedRoched with more flags.
func startTracedRochedArgs(t *testing.T, token string, args []string, env ...string) (r *roched, socket, addr string) {
	t.Helper()
	dir := shortDir(t)
	socket = filepath.Join(dir, "roched.sock")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close()
	cmd := exec.Command(os.Args[0], "--socket", socket, "--listen", "tcp://"+addr, "--token-file", tokenFile,
		"--providers", "docker", "--log-level", "debug")
	cmd.Args = append(cmd.Args, args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "OTEL_") && !strings.HasPrefix(e, "ROCHE_TOKEN=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(append(cmd.Env, "ROCHED_TEST_AS_DAEMON=1"), env...)
	r = &roched{cmd: cmd, log: &syncBuffer{}}
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	r.listening(t, socket)
	return r, socket, addr
}

// sigtermRoched stops roched as an operator does (SIGTERM), which sends the spans it holds.
func sigtermRoched(t *testing.T, r *roched) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Wait(); err != nil {
		t.Fatalf("roched on SIGTERM: %v; its log:\n%s", err, r.log)
	}
}

func secret(t *testing.T) string {
	b := make([]byte, 12)
	rand.Read(b)
	return "s3cret" + hex.EncodeToString(b)
}

// tracedCalls creates a sandbox, runs a command in it and destroys it through roched's
// TCP listener, under a span of the test's own tracer (the client's span), with secrets
// in the token, the create's and the command's env and the command itself.
func tracedCalls(t *testing.T, addr, token, secretValue string) (parent trace.SpanContext, id string) {
	t.Helper()
	c, err := client.New(client.WithAddress("http://"+addr), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tp := sdktrace.NewTracerProvider() // the caller's own tracing; exports nowhere
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(ctxFor(t, 2*time.Minute), "agent run")
	defer span.End()
	p := c.Provider("docker")
	cfg := pyConfig()
	cfg.Env = map[string]string{"API_KEY": secretValue}
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Destroy(ctx, sb.ID); err != nil { // under the span too
			t.Errorf("destroy: %v", err)
		}
	}()
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo $API_KEY $OTHER # " + secretValue},
		Env: map[string]string{"OTHER": secretValue}})
	if err != nil || res.ExitCode != 0 || !strings.Contains(string(res.Stdout), secretValue) {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	ex, err := p.RunCode(ctx, sb.ID, roche.CodeRequest{Code: "print('" + secretValue + "')"})
	if err != nil || ex.Error != nil || !strings.Contains(strings.Join(ex.Logs.Stdout, ""), secretValue) {
		t.Fatalf("run code: %+v, %v", ex, err)
	}
	return span.SpanContext(), sb.ID
}

// TestTracesEndToEnd: a real roched with --otlp-endpoint unset but
// OTEL_EXPORTER_OTLP_ENDPOINT set exports, over OTLP/HTTP protobuf to a receiver on
// 127.0.0.1, the spans of a create and an exec made by the Go client under the caller's
// span: roched's server spans are children of the client's span (traceparent), the
// provider's spans children of those, with tenant, provider and sandbox id, and no
// token, env value or command anywhere in them.
func TestTracesEndToEnd(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	recv := newOTLPReceiver(t)
	token, sec := secret(t), secret(t)
	r, _, addr := startTracedRoched(t, token, "OTEL_EXPORTER_OTLP_ENDPOINT="+recv.srv.URL)
	parent, id := tracedCalls(t, addr, token, sec)
	sigtermRoched(t, r)

	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Fatalf("the receiver got what it could not decode: %q", recv.bad)
	}
	byName := map[string]*tracepb.Span{}
	for _, s := range recv.spans {
		if trace.TraceID(s.TraceId) == parent.TraceID() {
			byName[s.Name] = s
		}
		// No secret in any name or attribute, of any span.
		for _, kv := range s.Attributes {
			if v := kv.GetValue().String(); strings.Contains(v, sec) || strings.Contains(v, token) {
				t.Errorf("span %s attribute %s holds a secret: %s", s.Name, kv.Key, v)
			}
		}
		if strings.Contains(s.Name, sec) || strings.Contains(s.Status.GetMessage(), sec) {
			t.Errorf("span %q holds a secret", s.Name)
		}
	}
	names := func() (n []string) {
		for k := range byName {
			n = append(n, k)
		}
		return n
	}
	attr := func(s *tracepb.Span, key string) string {
		for _, kv := range s.Attributes {
			if kv.Key == key {
				return kv.GetValue().GetStringValue()
			}
		}
		return ""
	}
	create, exec := byName["roche.v1.SandboxService/Create"], byName["roche.v1.SandboxService/Exec"]
	pcreate, pexec := byName["provider.create"], byName["provider.exec"]
	destroy, claim := byName["roche.v1.SandboxService/Destroy"], byName["pool.claim"]
	if create == nil || exec == nil || pcreate == nil || pexec == nil || destroy == nil || claim == nil {
		t.Fatalf("spans of the client's trace: %q; want Create, Exec, Destroy, pool.claim, provider.create and provider.exec (%d spans in all)",
			names(), len(recv.spans))
	}
	for _, s := range []*tracepb.Span{create, exec, destroy} {
		if trace.SpanID(s.ParentSpanId) != parent.SpanID() {
			t.Errorf("%s: parent %x, want the client's span %s", s.Name, s.ParentSpanId, parent.SpanID())
		}
		if s.Kind != tracepb.Span_SPAN_KIND_SERVER || attr(s, "roche.tenant") != "default" {
			t.Errorf("%s: kind %v, tenant %q; want a server span of tenant default", s.Name, s.Kind, attr(s, "roche.tenant"))
		}
	}
	// The agent's own spans, recorded in the sandbox and sent back with the result.
	aexec, aproc, acode, pcode := byName["agent.exec"], byName["agent.process"], byName["agent.run_code"], byName["provider.run_code"]
	if aexec == nil || aproc == nil || acode == nil || pcode == nil {
		t.Fatalf("spans of the client's trace: %q; want agent.exec, agent.process, provider.run_code and agent.run_code", names())
	}
	for _, c := range []struct{ child, parent *tracepb.Span }{{pcreate, create}, {claim, create}, {pexec, exec},
		{aexec, pexec}, {aproc, aexec}, {acode, pcode}} {
		if string(c.child.ParentSpanId) != string(c.parent.SpanId) {
			t.Errorf("%s: parent %x, want %s's %x", c.child.Name, c.child.ParentSpanId, c.parent.Name, c.parent.SpanId)
		}
	}
	for _, s := range []*tracepb.Span{create, exec, pcreate, pexec} {
		if attr(s, "roche.sandbox_id") != id {
			t.Errorf("%s: sandbox %q, want %s", s.Name, attr(s, "roche.sandbox_id"), id)
		}
	}
	for _, s := range []*tracepb.Span{create, pcreate, pexec} {
		if attr(s, "roche.provider") != "docker" {
			t.Errorf("%s: provider %q, want docker", s.Name, attr(s, "roche.provider"))
		}
	}
	for _, s := range []*tracepb.Span{aexec, aproc, acode} {
		if attr(s, "roche.component") != "roche-agent" || s.StartTimeUnixNano < pexec.StartTimeUnixNano && s != acode {
			t.Errorf("%s: component %q, start %d (provider.exec's %d)", s.Name, attr(s, "roche.component"), s.StartTimeUnixNano, pexec.StartTimeUnixNano)
		}
	}
	if aproc.EndTimeUnixNano < aproc.StartTimeUnixNano || aexec.EndTimeUnixNano > pexec.EndTimeUnixNano {
		t.Errorf("agent.process %d..%d, agent.exec ends %d after provider.exec %d", aproc.StartTimeUnixNano, aproc.EndTimeUnixNano,
			aexec.EndTimeUnixNano, pexec.EndTimeUnixNano)
	}
	// The provider's own calls to its engine (the Docker client's spans) are below them.
	var engine int
	for _, s := range recv.spans {
		if string(s.ParentSpanId) == string(pcreate.SpanId) && strings.HasPrefix(s.Name, "POST ") {
			engine++
		}
	}
	if engine == 0 {
		t.Errorf("no engine call below provider.create")
	}
	if !strings.Contains(r.log.String(), "trace_id="+parent.TraceID().String()) {
		t.Errorf("the audit log does not name the trace %s:\n%s", parent.TraceID(), r.log)
	}
	var service string
	for _, kv := range recv.resAttrs {
		if kv.Key == "service.name" {
			service = kv.GetValue().GetStringValue()
		}
	}
	if service != "roched" {
		t.Errorf("service.name %q, want roched", service)
	}
}

// TestTracesOff: a roched with no OTLP endpoint configured sends nothing, even for calls
// that carry a traceparent, and its audit log names no trace.
func TestTracesOff(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	recv := newOTLPReceiver(t)
	token, sec := secret(t), secret(t)
	// The receiver is where traces would go, were tracing on; it is not configured.
	r, _, addr := startTracedRoched(t, token, "ROCHE_TEST_UNUSED_RECEIVER="+recv.srv.URL)
	parent, _ := tracedCalls(t, addr, token, sec)
	sigtermRoched(t, r)
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if recv.requests != 0 {
		t.Errorf("tracing off, yet the receiver got %d requests", recv.requests)
	}
	if strings.Contains(r.log.String(), "trace_id") || strings.Contains(r.log.String(), parent.TraceID().String()) {
		t.Errorf("tracing off, yet the log names a trace:\n%s", r.log)
	}
}

// TestOTLPEndpoint: the flag wins over the environment, the traces variable over the
// generic one (to which /v1/traces is added), and a URL the exporter could not use is
// refused in one line saying what to give.
func TestOTLPEndpoint(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if got := OTLPEndpoint(""); got != "http://127.0.0.1:4318/v1/traces" {
		t.Errorf("generic: %q", got)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/t")
	if got := OTLPEndpoint(""); got != "http://127.0.0.1:9/t" {
		t.Errorf("traces: %q", got)
	}
	if got := OTLPEndpoint("https://127.0.0.1:1/x"); got != "https://127.0.0.1:1/x" {
		t.Errorf("flag: %q", got)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if got := OTLPEndpoint(""); got != "" {
		t.Errorf("none: %q, want tracing off", got)
	}
	for _, bad := range []string{"127.0.0.1:4318", "grpc://127.0.0.1:4317", "http://"} {
		var out, errb strings.Builder
		code := Main([]string{"--otlp-endpoint", bad, "--socket", filepath.Join(shortDir(t), "s.sock")}, &out, &errb)
		msg := errb.String()
		if code != 1 || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "http:// or https:// URL") {
			t.Errorf("--otlp-endpoint %q: exit %d, stderr %q", bad, code, msg)
		}
	}
}

// TestTracesPoolRefill: a pool's refill, made in the background outside any call, is a
// root span of its own (pool.refill, in a trace of its own) with a pool.create span per
// sandbox below it, naming the sandbox, and the engine's calls below that.
func TestTracesPoolRefill(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	recv := newOTLPReceiver(t)
	token := secret(t)
	r, _, _ := startTracedRochedArgs(t, token, []string{"--pool", "docker/" + testImage() + "?min=1&max=1"},
		"OTEL_EXPORTER_OTLP_ENDPOINT="+recv.srv.URL)
	// The pool's sandbox is ready when roched logs it (debug).
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(r.log.String(), "pool: sandbox ready") {
		if time.Now().After(deadline) {
			t.Fatalf("the pool made no sandbox; roched's log:\n%s", r.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sigtermRoched(t, r)

	recv.mu.Lock()
	defer recv.mu.Unlock()
	var refill, create *tracepb.Span
	for _, s := range recv.spans {
		switch s.Name {
		case "pool.refill":
			refill = s
		case "pool.create":
			create = s
		}
	}
	if refill == nil || create == nil {
		t.Fatalf("no pool.refill or pool.create span among %d", len(recv.spans))
	}
	if len(refill.ParentSpanId) != 0 {
		t.Errorf("pool.refill has a parent %x; want a root span", refill.ParentSpanId)
	}
	if string(create.ParentSpanId) != string(refill.SpanId) || string(create.TraceId) != string(refill.TraceId) {
		t.Errorf("pool.create's parent %x, want pool.refill's %x", create.ParentSpanId, refill.SpanId)
	}
	attrs := map[string]*commonpb.AnyValue{}
	for _, kv := range append(refill.Attributes, create.Attributes...) {
		attrs[kv.Key] = kv.Value
	}
	if attrs["roche.pool"].GetStringValue() != "docker/"+testImage() || attrs["roche.pool.count"].GetIntValue() != 1 ||
		attrs["roche.pool.made"].GetIntValue() != 1 ||
		attrs["roche.sandbox_id"].GetStringValue() == "" {
		t.Errorf("attributes %v; want the pool, count 1, made 1 and the sandbox id", attrs)
	}
	var engine int
	for _, s := range recv.spans {
		if string(s.ParentSpanId) == string(create.SpanId) && strings.HasPrefix(s.Name, "POST ") {
			engine++
		}
	}
	if engine == 0 {
		t.Errorf("no engine call below pool.create")
	}
}
