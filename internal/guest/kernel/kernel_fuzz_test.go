package kernel

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// maxHeld is the most Marks may hold between chunks: a mark's prefix, the digits of the
// largest cell number and the closing byte. Anything longer is not a mark and is output.
const maxHeld = len(markPrefix) + 20 + 1

// FuzzMarks feeds any raw output stream to Marks in any chunks: the output and the cells
// found are those of the stream fed whole, so that where the pipe happens to split it
// changes nothing; the bytes held between chunks stay within a mark's length, so that a
// program writing a mark's prefix and then endless output cannot make the agent hold
// it all; and what comes out is the stream without the marks it reported.
func FuzzMarks(f *testing.F) {
	f.Add([]byte("hello\x1eroche:sync:7\x1eafter\x1enot a mark\x1eroche:sync:x\x1e"), []byte{1, 3, 200})
	f.Add([]byte("\x1eroche:sync:\x1eroche:sync:12\x1e\x1eroche:sync:-3\x1e"), []byte{5})
	f.Add([]byte("\x1eroche:sync:"+strings.Repeat("1", 100)+"\x1e"), []byte{2, 2, 2})
	f.Add([]byte("\x1eroche:sync:"+strings.Repeat("x", 1000)), []byte{7})
	f.Add([]byte("out\x1eroche:syn"), []byte{4})
	f.Add([]byte("\x1eroche:sync:99999999999999999999999\x1e"), []byte{})
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		var whole Marks
		wantOut, wantCells := whole.Feed(stream)
		wantOut = append(wantOut, whole.Flush()...)

		var m Marks
		var out []byte
		var cells []int
		rest := stream
		for i := 0; len(rest) > 0; i++ {
			n := len(rest)
			if i < len(cuts) {
				n = min(n, int(cuts[i])+1)
			}
			o, c := m.Feed(rest[:n])
			out = append(out, o...)
			cells = append(cells, c...)
			rest = rest[n:]
			if len(m.held) > maxHeld {
				t.Fatalf("Marks holds %d bytes between chunks, more than a mark's %d", len(m.held), maxHeld)
			}
		}
		out = append(out, m.Flush()...)
		if !bytes.Equal(out, wantOut) || !slices.Equal(cells, wantCells) {
			t.Fatalf("in chunks %v: output %q, cells %v; fed whole: %q, %v", cuts, out, cells, wantOut, wantCells)
		}
		if len(out) > len(stream) {
			t.Fatalf("%d bytes out of %d in", len(out), len(stream))
		}
		// Putting back the marks reported, where they were taken out, gives the stream:
		// each mark taken is the prefix, a number and the closing byte, and no other
		// byte is lost or added.
		if got := len(stream) - len(out); got < len(cells)*(len(markPrefix)+2) {
			t.Fatalf("%d cells reported for %d bytes taken out", len(cells), got)
		}
		if len(cells) == 0 && !bytes.Equal(out, stream) {
			t.Fatalf("no mark reported, yet the output %q differs from the stream %q", out, stream)
		}
	})
}

// FuzzEvent decodes any event line as roche-agent and the wasm provider do, and checks
// that an event that decodes encodes back to an event that decodes the same.
func FuzzEvent(f *testing.F) {
	for _, s := range []string{
		`{"t":"ready","version":"3.12","pid":7}`,
		`{"t":"out","s":"hello\n"}`,
		`{"t":"result","data":{"text/plain":"1","image/png":"iVBOR"},"main":true}`,
		`{"t":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"..."}`,
		`{"t":"done","id":3,"count":2}`,
		`{"t":"done","id":1e400}`,
		`{"t":1}`,
		`not json`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var ev Event
		if json.Unmarshal(line, &ev) != nil {
			return
		}
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatalf("an event that decoded does not encode: %v", err)
		}
		var again Event
		if err := json.Unmarshal(b, &again); err != nil {
			t.Fatalf("an encoded event does not decode: %v", err)
		}
		b2, _ := json.Marshal(again)
		if !bytes.Equal(b, b2) {
			t.Fatalf("an event changes when encoded again: %s, then %s", b, b2)
		}
	})
}
