package roche

import (
	"errors"
	"fmt"
	"math"
	"strings"
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

// FuzzParseMount parses any --mount string: one that parses has a source and target,
// neither holding ':', and prints back to itself (with its mode spelled out).
func FuzzParseMount(f *testing.F) {
	for _, s := range []string{"/src:/dst", "/src:/dst:ro", "/src:/dst:rw", "/src:/dst:RW", "a:b:c:d", ":/dst", "/src:", "/src", "",
		"C:\\x:/dst", "/a b:/c d:ro"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMount(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("ParseMount(%q): %v does not wrap ErrInvalidConfig", s, err)
			}
			return
		}
		if m.Source == "" || m.Target == "" || strings.Contains(m.Source, ":") || strings.Contains(m.Target, ":") {
			t.Fatalf("ParseMount(%q) = %+v", s, m)
		}
		mode := "ro"
		if m.ReadWrite {
			mode = "rw"
		}
		back := m.Source + ":" + m.Target + ":" + mode
		if again, err := ParseMount(back); err != nil || again != m {
			t.Fatalf("ParseMount(%q) = %+v, which prints as %q, which parses to %+v (%v)", s, m, back, again, err)
		}
		if !m.ReadWrite && strings.Count(s, ":") == 2 && strings.HasSuffix(s, ":rw") {
			t.Fatalf("ParseMount(%q) is read-only", s)
		}
	})
}

// FuzzParseEnv parses any KEY=VALUE pairs (one a line here): every pair with a key
// and '=' is kept, the value being everything after the first '=', a later pair for
// the same key winning; a pair without either is an error naming it; and an
// environment that passes Config.Validate holds nothing a process could not receive.
func FuzzParseEnv(f *testing.F) {
	for _, s := range []string{"A=1", "A=1\nB=2", "A=1\nA=2", "=x", "NOEQ", "A==b", "A=b=c", "A=\x00", "K\x00=v", "A=x\x00y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pairs := strings.Split(s, "\n")
		env, err := ParseEnv(pairs)
		want := map[string]string{}
		bad := false
		for _, p := range pairs {
			k, v, ok := strings.Cut(p, "=")
			if !ok || k == "" {
				bad = true
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", p)) {
					t.Fatalf("pair %q: ParseEnv said %v", p, err)
				}
				continue
			}
			want[k] = v
		}
		if !bad && err != nil {
			t.Fatalf("ParseEnv(%q): %v", pairs, err)
		}
		for k, v := range want {
			if env[k] != v {
				t.Fatalf("ParseEnv(%q)[%q] = %q, want %q", pairs, k, env[k], v)
			}
		}
		if len(env) != len(want) {
			t.Fatalf("ParseEnv(%q) = %q, want %q", pairs, env, want)
		}
		cfg := DefaultConfig()
		cfg.Env = env
		if cfg.Validate() == nil {
			for k, v := range env {
				if strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
					t.Fatalf("Validate passed env %q=%q", k, v)
				}
			}
		}
	})
}
