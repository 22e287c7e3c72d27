package roche

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

// formatSize renders a byte count as the size flags take it: the largest binary unit
// that divides it, else bytes ("1g", "512m", "1536k", "17").
func formatSize(n int64) string {
	for _, u := range []struct {
		unit  string
		shift uint
	}{{"t", 40}, {"g", 30}, {"m", 20}, {"k", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.unit)
		}
	}
	return fmt.Sprint(n)
}

// FuzzSizes parses any string with the three size parsers (ParseMemory for --memory,
// ParseDisk for --disk and workspace sizes, ParseSize for --max-bytes): a size each
// accepts is within its bounds, prints back (as the flags take it) to a string it
// parses to the same size, and where two of them accept the same string they agree on
// its size.
func FuzzSizes(f *testing.F) {
	for _, s := range []string{"512m", "1g", "1.5g", "65536k", "512MiB", "1GB", "0", "-1", "8m", "1t", "1p", "2tib",
		" 4g ", "0x10p20", "1e9", "NaN", "inf", "1.0000001k", "6291456", "6291455", "9223372036854775807",
		"8388607.9", "b", "ib", "kib", "1.5", "0.5k", "64 MiB", "4096 bytes", "1 GiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		type parser struct {
			name     string
			parse    func(string) (int64, error)
			min, max int64
		}
		parsers := []parser{
			{"ParseMemory", ParseMemory, minMemory, math.MaxInt64 / 2},
			{"ParseDisk", ParseDisk, 0, MaxDisk},
			{"ParseSize", ParseSize, 1, math.MaxInt64 / 2},
		}
		got := map[string]int64{}
		for _, p := range parsers {
			n, err := p.parse(s)
			if err != nil {
				if !errors.Is(err, ErrInvalidConfig) && p.name == "ParseSize" {
					t.Errorf("%s(%q): %v does not wrap ErrInvalidConfig", p.name, s, err)
				}
				continue
			}
			got[p.name] = n
			if n < p.min || n > p.max || p.name == "ParseDisk" && n != 0 && n < MinDisk {
				t.Errorf("%s(%q) = %d, outside its bounds", p.name, s, n)
			}
			back := formatSize(n)
			if again, err := p.parse(back); err != nil || again != n {
				t.Errorf("%s(%q) = %d, which prints as %q, which parses to %d (%v)", p.name, s, n, back, again, err)
			}
		}
		var first string
		for name, n := range got {
			if first == "" {
				first = name
				continue
			}
			if n != got[first] && n != 0 && got[first] != 0 {
				t.Errorf("%q is %d to %s and %d to %s", s, got[first], first, n, name)
			}
		}
	})
}
