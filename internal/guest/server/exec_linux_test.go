package server

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestOOMKillsReadsAfresh checks that the OOM-kill counter, read through the descriptor
// the agent keeps open, says what the file says now, on every read.
func TestOOMKillsReadsAfresh(t *testing.T) {
	var file string
	var want int64 = -1
	for _, f := range oomCounter.files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				want, _ = strconv.ParseInt(v, 10, 64)
				file = f
			}
		}
		if file != "" {
			break
		}
	}
	if file == "" {
		t.Skip("this host has no memory cgroup with an OOM-kill counter")
	}
	for i := 0; i < 3; i++ {
		if got := oomKills(); got != want {
			t.Fatalf("read %d: oomKills() = %d, %s says %d", i, got, file, want)
		}
	}
	if !oomCounter.found {
		t.Fatalf("the counter's descriptor was not kept")
	}
}
