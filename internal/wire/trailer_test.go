package wire

import (
	"net/http"
	"reflect"
	"testing"

	"github.com/roche-sandbox/roche"
)

func TestSkippedTrailerRoundTrip(t *testing.T) {
	in := roche.CopyReport{Skipped: 3, SkippedLinks: 2, Examples: []roche.SkippedEntry{
		{Path: "/tmp/e", Target: "/etc", Reason: "symlink"},
		{Path: "/tmp/t/out, with \"quotes\" -> x", Target: "../..", Reason: "outside"},
		{Path: "/tmp/fifo", Reason: "special"},
	}}
	h := http.Header{}
	SetSkipped(h, in)
	if got := Skipped(h); !reflect.DeepEqual(got, in) {
		t.Fatalf("round trip: %+v, want %+v", got, in)
	}
	empty := http.Header{}
	SetSkipped(empty, roche.CopyReport{Files: 3})
	if len(empty) != 0 || Skipped(empty).Skipped != 0 {
		t.Fatalf("nothing skipped, yet trailers %v", empty)
	}
}
