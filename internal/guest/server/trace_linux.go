package server

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
)

// reqTrace is what the agent keeps to record its spans of one request that asked for
// them (guest.Request.TraceParent): the span it is below and when it came.
type reqTrace struct {
	parent   string
	received time.Time
}

// newReqTrace is nil, and records nothing, unless req asked for spans.
func newReqTrace(req guest.Request) *reqTrace {
	parent := guest.ParentSpanID(req.TraceParent)
	if parent == "" {
		return nil
	}
	return &reqTrace{parent: parent, received: time.Now()}
}

func spanID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// spans are a command's: agent.exec, from its request to its result, and below it
// agent.process, from the command's start to its exit (pid, exit code, signal).
func (p *proc) spans(res guest.Result) []guest.Span {
	t := p.trace
	if t == nil {
		return nil
	}
	now := time.Now()
	exec := guest.Span{ID: spanID(), Parent: t.parent, Name: "agent.exec",
		StartNS: t.received.UnixNano(), EndNS: now.UnixNano(),
		Attrs: map[string]any{"roche.exit_code": res.ExitCode, "roche.timed_out": res.TimedOut}}
	spans := []guest.Span{exec}
	if !p.started.IsZero() {
		proc := guest.Span{ID: spanID(), Parent: exec.ID, Name: "agent.process",
			StartNS: p.started.UnixNano(), EndNS: now.UnixNano(),
			Attrs: map[string]any{"process.pid": p.pid, "process.exit_code": res.ExitCode}}
		if res.Signal != 0 {
			proc.Attrs["roche.signal"] = res.Signal
		}
		if res.Receipt != nil {
			proc.Attrs["roche.cpu_time_ns"] = res.Receipt.CPUTimeNS
			proc.Attrs["roche.peak_memory_bytes"] = res.Receipt.PeakMemoryBytes
		}
		spans = append(spans, proc)
	}
	if res.TimedOut {
		spans[0].Error = "the command timed out"
	}
	return spans
}

// codeSpans are a cell's: agent.run_code, from its request to its end (its context and
// execution count; the exception's name when it raised one).
func (t *reqTrace) codeSpans(end guest.CodeEnd) []guest.Span {
	if t == nil {
		return nil
	}
	sp := guest.Span{ID: spanID(), Parent: t.parent, Name: "agent.run_code",
		StartNS: t.received.UnixNano(), EndNS: time.Now().UnixNano(),
		Attrs: map[string]any{"roche.context": end.Context, "roche.execution_count": end.ExecutionCount,
			"roche.restarted": end.Restarted}}
	switch {
	case end.Error != nil:
		sp.Error = end.Error.Name
	case end.TimedOut:
		sp.Error = "the cell timed out"
	}
	return []guest.Span{sp}
}
