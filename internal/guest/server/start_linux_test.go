package server

import (
	"slices"
	"testing"
)

// TestCapsIn: the bounding set is read from the status text, and an unreadable one
// means every capability, so that nothing is left in the set by a parse error.
func TestCapsIn(t *testing.T) {
	status := "Name:\troche-agent\nCapPrm:\t00000000000000ff\nCapBnd:\t00000000000000c1\nCapAmb:\t0000000000000000\n"
	if got := capsIn(status, "CapBnd", 40); !slices.Equal(got, []int{0, 6, 7}) {
		t.Errorf("CapBnd c1: %v, want [0 6 7]", got)
	}
	if got := capsIn("CapBnd:\t000001ffffffffff\n", "CapBnd", 40); len(got) != 41 || got[40] != 40 {
		t.Errorf("a full set up to cap 40: %v", got)
	}
	for _, bad := range []string{"", "CapBnd:\tzz\n", "CapBndx\n"} {
		if got := capsIn(bad, "CapBnd", 40); len(got) != 41 {
			t.Errorf("status %q: %d capabilities, want all 41", bad, len(got))
		}
	}
}

// TestReserveThreads: the process has at least the threads asked for when it returns.
func TestReserveThreads(t *testing.T) {
	want := countThreads() + 8
	reserveThreads(want)
	if got := countThreads(); got < want {
		t.Fatalf("%d threads after reserving %d", got, want)
	}
}
