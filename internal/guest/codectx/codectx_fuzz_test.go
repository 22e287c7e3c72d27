package codectx

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/guest/kernel"
)

// FuzzEventWriter writes any event stream to the parser in any chunks, both as a pipe
// of events only (roche-agent's) and as python.wasm's stdout, where raw writes land
// too, with the longest event lowered to 64 bytes so that inputs reach it. Each line of
// at most that length that is an event is queued as one, however the stream is chunked;
// on python.wasm's stdout every other byte is the cell's stdout, in order; on a pipe of
// events the rest is dropped, each overlong line with one note on stderr; and the parser
// never holds more than the longest event between writes (its reader holds what it holds).
func FuzzEventWriter(f *testing.F) {
	const maxEventLine = 64
	for _, s := range []string{
		`{"t":"out","s":"hi\n"}` + "\n" + "raw print\n" + `{"t":"done","id":1,"count":1}` + "\n",
		`{"t":"result","data":{"text/plain":"` + strings.Repeat("x", 100) + `"}}` + "\n",
		strings.Repeat("no newline ", 20),
		"partial {\"t\":\"done\"",
		strings.Repeat("y", 70) + `{"t":"done","id":2}` + "\n",
		`{"t":""}` + "\n" + `{}` + "\n" + "\n",
	} {
		f.Add([]byte(s), []byte{3, 10, 64}, false)
		f.Add([]byte(s), []byte{3, 10, 64}, true)
	}
	f.Fuzz(func(t *testing.T, stream, cuts []byte, mixed bool) {
		k := NewKernel(nil)
		k.events = make(chan Event, len(stream)+1)
		out := &streams{}
		k.setCell(&cellRun{out: out, limit: 1 << 30})
		w := &eventWriter{k: k, mixed: mixed, max: maxEventLine}
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
			if len(w.line) > maxEventLine {
				t.Fatalf("the parser holds %d bytes between writes, over the %d of the longest event", len(w.line), maxEventLine)
			}
		}
		w.flush()
		k.EndEvents()
		var events []kernel.Event
		for ev := range k.events {
			if !bytes.HasSuffix(ev.Raw, []byte("\n")) || len(ev.Raw) > maxEventLine {
				t.Fatalf("event line %q", ev.Raw)
			}
			events = append(events, ev.Event)
		}
		// What each line should have been, decided here.
		var wantEvents []kernel.Event
		var wantOut, wantErr bytes.Buffer
		for _, line := range bytes.SplitAfter(stream, []byte("\n")) {
			var ev kernel.Event
			switch {
			case !bytes.HasSuffix(line, []byte("\n")): // unfinished: no event
				if mixed {
					wantOut.Write(line)
				}
			case len(line) <= maxEventLine && json.Unmarshal(line, &ev) == nil && ev.T != "":
				wantEvents = append(wantEvents, ev)
			case mixed:
				wantOut.Write(line)
			case len(line) > maxEventLine:
				wantErr.WriteString("roche: a result of more than 0 MiB was dropped\n")
			}
		}
		if got := out.s[Stdout].String(); got != wantOut.String() {
			t.Fatalf("stdout %q, want %q", got, wantOut.String())
		}
		if got := out.s[Stderr].String(); got != wantErr.String() {
			t.Fatalf("stderr %q, want %q", got, wantErr.String())
		}
		if !reflect.DeepEqual(events, wantEvents) {
			t.Fatalf("events %+v, want %+v", events, wantEvents)
		}
	})
}

// TestEventWriterBoundsALine: a cell writing to python.wasm's fd 1 without a newline
// (os.write(1, ...) in a loop) is passed on as its stdout, not held: the reader holds at
// most the longest event, 7 MiB, whatever the cell writes. On a pipe of events a line
// that long is dropped as it comes.
func TestEventWriterBoundsALine(t *testing.T) {
	for _, mixed := range []bool{true, false} {
		k := NewKernel(nil)
		out := &streams{}
		k.setCell(&cellRun{out: out, limit: 1 << 20})
		w := &eventWriter{k: k, mixed: mixed, max: maxEventLine}
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for range 16 {
			_, _ = w.Write(chunk)
			if len(w.line) > 7<<20 {
				t.Fatalf("mixed %v: %d bytes held after a cell wrote no newline", mixed, len(w.line))
			}
		}
		_, _ = w.Write([]byte("\n"))
		want, wantErr := 1<<20, ""
		if !mixed {
			want, wantErr = 0, "roche: a result of more than 7 MiB was dropped\n"
		}
		if got := out.s[Stdout].Len(); got != want || out.s[Stderr].String() != wantErr {
			t.Fatalf("mixed %v: the cell's stdout got %d bytes, want %d; stderr %q, want %q", mixed, got, want, out.s[Stderr].String(), wantErr)
		}
	}
}

// streams keeps a cell's two streams and its results.
type streams struct {
	s       [2]bytes.Buffer
	results []Event
}

func (o *streams) Write(s Stream, p []byte) { o.s[s].Write(p) }
func (o *streams) Result(ev Event)          { o.results = append(o.results, ev) }
