package server

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestCapsWhere: the capabilities held are listed, and one whose presence cannot be
// read is too, so that nothing is left in the bounding set by a failed read.
func TestCapsWhere(t *testing.T) {
	held := map[int]bool{0: true, 6: true, 7: true}
	got := capsWhere(40, func(c int) (bool, error) {
		if c == 9 {
			return false, errors.New("unreadable")
		}
		return held[c], nil
	})
	if !slices.Equal(got, []int{0, 6, 7, 9}) {
		t.Errorf("held 0, 6, 7 and 9 unreadable: %v, want [0 6 7 9]", got)
	}
	// This thread's own set, as the kernel reports it, matches /proc's view of it.
	var bnd uint64
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			bnd, _ = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	for _, c := range boundingSet() {
		if bnd&(1<<c) == 0 {
			t.Errorf("capability %d listed, but not in CapBnd %x", c, bnd)
		}
		bnd &^= 1 << c
	}
	if bnd != 0 {
		t.Errorf("CapBnd holds %x that boundingSet left out", bnd)
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
