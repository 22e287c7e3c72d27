package roche

import (
	"math"
	"testing"

	"github.com/roche-sandbox/roche/internal/size"
)

// FuzzSizes parses any text as the sizes of a Config do (Memory with parseMemory, Disk
// and WorkspaceSize with parseDisk): a size either accepts is within its bounds, is what
// the one grammar (internal/size) reads, and prints (size.String) as text it accepts
// back as the same size.
func FuzzSizes(f *testing.F) {
	for _, s := range []string{"512m", "1g", "1.5g", "65536k", "512MiB", "1GB", "0", "-1", "8m", "1t", "1p", "2tib",
		" 4g ", "0x10p20", "1e9", "NaN", "inf", "1.0000001k", "6291456", "6291455", "9223372036854775807",
		"8388607.9", "b", "ib", "kib", "1.5", "0.5k", "64 MiB", "4096 bytes", "1 GiB", "0.1", "0.5b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range []struct {
			name     string
			parse    func(string) (int64, error)
			min, max int64
		}{
			{"parseMemory", parseMemory, minMemory, math.MaxInt64},
			{"parseDisk", parseDisk, 0, MaxDisk},
		} {
			n, err := p.parse(s)
			if err != nil {
				continue
			}
			if n < p.min || n > p.max || p.name == "parseDisk" && n != 0 && n < MinDisk {
				t.Errorf("%s(%q) = %d, outside its bounds", p.name, s, n)
			}
			if v, err := size.Parse(s); err != nil || v != n {
				t.Errorf("%s(%q) = %d, but the size grammar reads %d (%v)", p.name, s, n, v, err)
			}
			back := size.String(n)
			if again, err := p.parse(back); err != nil || again != n {
				t.Errorf("%s(%q) = %d, which prints as %q, which parses to %d (%v)", p.name, s, n, back, again, err)
			}
		}
	})
}
