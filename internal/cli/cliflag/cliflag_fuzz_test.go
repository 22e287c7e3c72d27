package cliflag

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

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
			if !errors.Is(err, roche.ErrInvalidConfig) {
				t.Errorf("ParseMount(%q): %v does not wrap roche.ErrInvalidConfig", s, err)
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
		cfg := roche.DefaultConfig()
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
