package cliflag

import (
	"errors"
	"testing"

	"github.com/roche-sandbox/roche"
)

func TestParseMount(t *testing.T) {
	m, err := ParseMount("/h:/s")
	if err != nil || m != (roche.Mount{Source: "/h", Target: "/s"}) {
		t.Fatalf("default mode: %+v %v", m, err)
	}
	m, err = ParseMount("/h:/s:rw")
	if err != nil || !m.ReadWrite || m.String() != "/h:/s:rw" {
		t.Fatalf("rw: %+v %v", m, err)
	}
	for _, bad := range []string{"/h", ":/s", "/h:/s:rx", "/h:/s:ro:x"} {
		if _, err := ParseMount(bad); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("ParseMount(%q): %v", bad, err)
		}
	}
}

func TestParseEnv(t *testing.T) {
	env, err := ParseEnv([]string{"A=1", "B=x=y", "C="})
	if err != nil || env["A"] != "1" || env["B"] != "x=y" || env["C"] != "" || len(env) != 3 {
		t.Fatalf("%v %v", env, err)
	}
	if _, err := ParseEnv([]string{"NOVALUE", "=x"}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("bad pairs accepted: %v", err)
	}
}
