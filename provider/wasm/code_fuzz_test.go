package wasm

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/guest/kernel"
)

// FuzzEventWriter writes any stdout of a python.wasm instance to the event parser in any
// chunks, with the longest event lowered to 64 bytes so that inputs reach it. Each line
// of at most that length that is an event is queued as one, every other byte is the
// cell's stdout, in order, however the stream is chunked; and the parser never holds
// more than the longest event between writes (roched holds what it holds).
func FuzzEventWriter(f *testing.F) {
	saved := maxEventLine
	maxEventLine = 64
	f.Cleanup(func() { maxEventLine = saved })
	for _, s := range []string{
		`{"t":"out","s":"hi\n"}` + "\n" + "raw print\n" + `{"t":"done","id":1,"count":1}` + "\n",
		`{"t":"result","data":{"text/plain":"` + strings.Repeat("x", 100) + `"}}` + "\n",
		strings.Repeat("no newline ", 20),
		"partial {\"t\":\"done\"",
		strings.Repeat("y", 70) + `{"t":"done","id":2}` + "\n",
		`{"t":""}` + "\n" + `{}` + "\n" + "\n",
	} {
		f.Add([]byte(s), []byte{3, 10, 64})
	}
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		k := &wasmKernel{ctx: context.Background(), events: make(chan kernel.Event, len(stream)+1)}
		var logs []string
		k.setCell(&wasmCell{stdout: &capped{into: &logs, limit: 1 << 30}, stderr: &capped{into: &logs, limit: 1 << 30}})
		w := eventWriter{k}
		rest := stream
		for i := 0; len(rest) > 0; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, int(cuts[i])+1)
			}
			if m, err := w.Write(rest[:n]); m != n || err != nil {
				t.Fatalf("Write took %d of %d bytes: %v", m, n, err)
			}
			rest = rest[n:]
			if len(k.line) > maxEventLine {
				t.Fatalf("the parser holds %d bytes between writes, over the %d of the longest event", len(k.line), maxEventLine)
			}
		}
		close(k.events)
		var events []kernel.Event
		for ev := range k.events {
			events = append(events, ev)
		}
		// What each line should have been, decided here.
		var wantEvents []kernel.Event
		var wantOut bytes.Buffer
		lines := bytes.SplitAfter(stream, []byte("\n"))
		for i, line := range lines {
			if !bytes.HasSuffix(line, []byte("\n")) {
				if i == len(lines)-1 && len(line) > maxEventLine {
					wantOut.Write(line) // an unfinished line already too long to be an event
				}
				continue
			}
			var ev kernel.Event
			if len(line) <= maxEventLine && json.Unmarshal(line, &ev) == nil && ev.T != "" {
				wantEvents = append(wantEvents, ev)
			} else {
				wantOut.Write(line)
			}
		}
		if got := strings.Join(logs, ""); got != wantOut.String() {
			t.Fatalf("stdout %q, want %q", got, wantOut.String())
		}
		if !reflect.DeepEqual(events, wantEvents) {
			t.Fatalf("events %+v, want %+v", events, wantEvents)
		}
	})
}

// TestEventWriterBoundsALine: a cell writing to fd 1 without a newline (os.write(1, ...)
// in a loop) is passed on as its stdout, not held: roched holds at most the longest
// event, 7 MiB, whatever the cell writes.
func TestEventWriterBoundsALine(t *testing.T) {
	k := &wasmKernel{ctx: context.Background(), events: make(chan kernel.Event, 1)}
	var logs []string
	k.setCell(&wasmCell{stdout: &capped{into: &logs, limit: 1 << 20}, stderr: &capped{into: &logs, limit: 1 << 20}})
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	for range 16 {
		_, _ = eventWriter{k}.Write(chunk)
		if len(k.line) > 7<<20 {
			t.Fatalf("%d bytes held after a cell wrote no newline", len(k.line))
		}
	}
	if got := len(strings.Join(logs, "")); got != 1<<20 {
		t.Fatalf("the cell's stdout got %d bytes, want its 1 MiB limit", got)
	}
}
