package server_test

import (
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestExecSpans: an exec whose request carries a traceparent gets the agent's spans
// back with its result (agent.exec below the traceparent's span, agent.process below
// it, timed around the command); one without gets none, so tracing off costs nothing.
func TestExecSpans(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	res, _, _ := execOut(t, guest.Request{Cmd: []string{"sh", "-c", "exit 4"}}, guest.ExecOptions{})
	if res.ExitCode != 4 || res.Spans != nil {
		t.Fatalf("without a traceparent: exit %d, spans %+v; want 4 and none", res.ExitCode, res.Spans)
	}
	const parent = "00f067aa0ba902b7"
	before := time.Now()
	res, _, _ = execOut(t, guest.Request{Cmd: []string{"sh", "-c", "sleep 0.2; exit 4"},
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-" + parent + "-01"}, guest.ExecOptions{})
	after := time.Now()
	if len(res.Spans) != 2 {
		t.Fatalf("spans %+v; want agent.exec and agent.process", res.Spans)
	}
	exec, proc := res.Spans[0], res.Spans[1]
	if exec.Name != "agent.exec" || exec.Parent != parent || proc.Name != "agent.process" || proc.Parent != exec.ID ||
		len(exec.ID) != 16 || len(proc.ID) != 16 || exec.ID == proc.ID {
		t.Errorf("spans %+v; want agent.exec below %s and agent.process below it", res.Spans, parent)
	}
	if exec.StartNS < before.UnixNano() || exec.EndNS > after.UnixNano() || proc.StartNS < exec.StartNS ||
		time.Duration(proc.EndNS-proc.StartNS) < 200*time.Millisecond {
		t.Errorf("times: exec %d..%d, process %d..%d, within %d..%d; the process took 0.2 s",
			exec.StartNS, exec.EndNS, proc.StartNS, proc.EndNS, before.UnixNano(), after.UnixNano())
	}
	// Numbers come as JSON's.
	if proc.Attrs["process.exit_code"] != 4.0 || proc.Attrs["process.pid"] != float64(res.PID) {
		t.Errorf("process attributes %v; want exit code 4 and pid %d", proc.Attrs, res.PID)
	}
	// A malformed traceparent asks for nothing.
	res, _, _ = execOut(t, guest.Request{Cmd: []string{"true"}, TraceParent: "00-zz"}, guest.ExecOptions{})
	if res.Spans != nil {
		t.Errorf("a malformed traceparent got spans %+v", res.Spans)
	}
}
