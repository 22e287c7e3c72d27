package kit

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) { f.n++; return 0, errors.New("closed") }

func TestOutputCaptureCapsAndFlags(t *testing.T) {
	var sink bytes.Buffer
	c := NewOutputCapture(10, &sink)
	for _, s := range []string{"hello", " world", "!!!"} {
		if n, err := c.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v: a capture must accept everything", s, n, err)
		}
	}
	if c.String() != "hello worl" || sink.String() != "hello worl" || !c.Truncated() {
		t.Fatalf("kept %q, streamed %q, truncated %v", c.String(), sink.String(), c.Truncated())
	}
}

func TestOutputCaptureUnderLimitNotFlagged(t *testing.T) {
	c := NewOutputCapture(0, nil)
	c.Write([]byte(strings.Repeat("x", roche.DefaultOutputLimit)))
	if c.Truncated() || len(c.String()) != roche.DefaultOutputLimit {
		t.Fatalf("exactly the default limit: truncated %v, kept %d", c.Truncated(), len(c.String()))
	}
	c.Write([]byte("y"))
	if !c.Truncated() {
		t.Fatal("one byte past the limit not flagged")
	}
}

func TestOutputCaptureDropsFailingSink(t *testing.T) {
	f := &failingWriter{}
	c := NewOutputCapture(100, f)
	c.Write([]byte("a"))
	c.Write([]byte("b"))
	if f.n != 1 || c.String() != "ab" {
		t.Fatalf("sink written %d times, kept %q", f.n, c.String())
	}
}

// TestCapturesStreamOnly: with StreamOnly the bytes reach the sink, up to the limit, and
// none are kept; a stream without a sink is kept as usual.
func TestCapturesStreamOnly(t *testing.T) {
	var sink bytes.Buffer
	stdout, stderr := Captures(roche.ExecRequest{Stdout: &sink, OutputLimit: 4, StreamOnly: true})
	stdout.Write([]byte("abcdef"))
	stderr.Write([]byte("xy"))
	if sink.String() != "abcd" || stdout.String() != "" || !stdout.Truncated() {
		t.Fatalf("streamed %q, kept %q, truncated %v", sink.String(), stdout.String(), stdout.Truncated())
	}
	if stderr.String() != "xy" || stderr.Truncated() {
		t.Fatalf("stderr without a sink: kept %q", stderr.String())
	}
}
