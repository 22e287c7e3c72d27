package wire

import (
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// Every kind survives the wire both ways, and a kind the enum lacks reads as unknown.
func TestEndKindsRoundTrip(t *testing.T) {
	for _, k := range roche.EndKinds {
		if got := EndKindFromProto(EndKindToProto(k)); got != k {
			t.Errorf("%s came back as %s", k, got)
		}
	}
	if got := EndKindFromProto(EndKindToProto("made-up")); got != roche.EndUnknown {
		t.Errorf("an unknown kind came back as %s", got)
	}
	at := time.Now().Truncate(time.Second)
	e := &roche.EndReason{Kind: roche.EndOOM, At: at, Detail: "d", Evidence: "memory.events oom_kill 0 -> 1", ExitCode: 137, ExitKnown: true}
	got := EndFromProto(EndToProto(e))
	if got.Kind != e.Kind || !got.At.Equal(at) || got.Evidence != e.Evidence || got.ExitCode != 137 || !got.ExitKnown {
		t.Errorf("round trip: %+v, want %+v", got, e)
	}
	r := &roche.Receipt{PeakMemoryBytes: 1 << 27, CPUTime: 3 * time.Second, Leftover: 2}
	if got := ReceiptFromProto(ReceiptToProto(r)); *got != *r {
		t.Errorf("receipt round trip: %+v, want %+v", got, r)
	}
}
