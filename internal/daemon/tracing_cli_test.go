package daemon

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestCLITraceparent: the roche CLI continues the trace of the script that runs it. With
// TRACEPARENT set, roche run through a real roched with tracing on makes roched's server
// spans (Create, the exec, Destroy) children of the script's span, in its trace, as the
// in-process OTLP receiver sees them; a malformed TRACEPARENT is warned about and the
// command still runs.
func TestCLITraceparent(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	recv := newOTLPReceiver(t)
	token := secret(t)
	r, _, addr := startTracedRoched(t, token, "OTEL_EXPORTER_OTLP_ENDPOINT="+recv.srv.URL)
	const traceID, spanID = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
	t.Setenv("ROCHE_TOKEN", token)
	t.Setenv("ROCHE_TOKEN_FILE", "")
	roche := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		args = append([]string{"--socket", filepath.Join(shortDir(t), "none.sock"), "--address", "http://" + addr}, args...)
		code := cli.Main(args, strings.NewReader(""), &out, &errb, nil)
		return code, out.String(), errb.String()
	}
	t.Setenv("TRACEPARENT", "00-"+traceID+"-"+spanID+"-01")
	if code, out, errs := roche("run", "--image", testImage(), "--", "echo", "traced"); code != 0 || out != "traced\n" {
		t.Fatalf("roche run: %d %q %q", code, out, errs)
	}
	t.Setenv("TRACEPARENT", "not-a-traceparent")
	if code, _, errs := roche("list"); code != 0 || !strings.Contains(errs, "TRACEPARENT is not a W3C traceparent") {
		t.Errorf("roche list with a malformed TRACEPARENT: %d %q; want it to run and warn", code, errs)
	}
	sigtermRoched(t, r)

	recv.mu.Lock()
	defer recv.mu.Unlock()
	var server []string
	for _, s := range recv.spans {
		if trace.TraceID(s.TraceId).String() != traceID || s.Kind != tracepb.Span_SPAN_KIND_SERVER {
			continue
		}
		server = append(server, s.Name)
		if trace.SpanID(s.ParentSpanId).String() != spanID {
			t.Errorf("%s: parent %x, want the script's span %s", s.Name, s.ParentSpanId, spanID)
		}
	}
	joined := strings.Join(server, " ")
	for _, want := range []string{"/Create", "/Destroy", "/Exec"} {
		if !strings.Contains(joined, want) {
			t.Errorf("roched's server spans in the script's trace: %q; want %s among them (%d spans in all)", server, want, len(recv.spans))
		}
	}
}
