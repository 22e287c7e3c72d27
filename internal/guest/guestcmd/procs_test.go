package guestcmd

import "testing"

func TestRatio(t *testing.T) {
	for _, c := range []struct {
		quota, period string
		want          float64
		ok            bool
	}{
		{"100000", "100000", 1, true},
		{"50000", "100000", 0.5, true},
		{"250000", "100000", 2.5, true},
		{"max", "100000", 0, false}, // cgroup v2 without a limit
		{"-1", "100000", 0, false},  // cgroup v1 without a limit
		{"100000", "0", 0, false},
	} {
		got, ok := ratio(c.quota, c.period)
		if got != c.want || ok != c.ok {
			t.Errorf("ratio(%q, %q) = %v, %v; want %v, %v", c.quota, c.period, got, ok, c.want, c.ok)
		}
	}
}
