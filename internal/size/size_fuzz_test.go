package size

import (
	"strings"
	"testing"
)

// FuzzRoundTrip parses any text as a size: one that parses is 0 or more bytes and
// prints (String) as text that parses back to it; and any count of bytes prints as
// text that parses back to it. What Roche prints, a
// user can give back, and means the same.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"512m", "1g", "1.5g", "65536k", "512MiB", "512mb", "1GB", "0", "-1", "8m", "1t", "1p", "2tib",
		" 4g ", "0x10p20", "1e9", "NaN", "inf", "1.0000001k", "6291456", "6291455", "9223372036854775807",
		"9223372036854775808", "8388607.9", "b", "ib", "kib", "1.5", "0.5k", "64 MiB", "4096 bytes", "1 GiB", "1 byte",
		"1.25 MiB", "0.001k", "7.999999999p"} {
		f.Add(s, int64(len(s))<<20+int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, s string, n int64) {
		if v, err := Parse(s); err == nil {
			if v < 0 {
				t.Fatalf("Parse(%q) = %d", s, v)
			}
			printed := String(v)
			if again, err := Parse(printed); err != nil || again != v {
				t.Fatalf("Parse(%q) = %d, which prints as %q, which parses to %d (%v)", s, v, printed, again, err)
			}
			if strings.TrimSpace(s) == "" {
				t.Fatalf("Parse(%q) took blank text for %d", s, v)
			}
		}
		if n < 0 {
			n = -(n + 1)
		}
		printed := String(n)
		if again, err := Parse(printed); err != nil || again != n {
			t.Fatalf("String(%d) = %q, which parses to %d (%v)", n, printed, again, err)
		}
	})
}
