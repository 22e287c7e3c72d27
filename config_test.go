package roche

import (
	"errors"
	"strings"
	"testing"
)

func TestDefaultConfigIsSecureAndValid(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Network || c.Writable || c.User == "" || strings.HasPrefix(c.User, "0") || c.PidsLimit != 64 ||
		c.MemoryBytes() != 512<<20 || c.CPUs != 1 || c.TimeoutSecs != 300 {
		t.Fatalf("defaults are not the secure ones: %+v", c)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := DefaultConfig()
	c.Image = ""
	c.Memory = "512x"
	c.CPUs = 0
	c.TimeoutSecs = -1
	c.PidsLimit = 0
	c.Workdir = "relative"
	c.Env = map[string]string{"A=B": "x"}
	c.Mounts = []Mount{{Source: "rel", Target: "/"}}
	c.NetworkAllowlist = []string{"https://pypi.org"}
	err := c.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"image", "memory", "cpus", "timeout_secs", "pids_limit", "workdir", "env name", "mount source", "mount target /", "network_allowlist"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestParseMemory(t *testing.T) {
	good := map[string]int64{"512m": 512 << 20, "1g": 1 << 30, "1G": 1 << 30, "1.5g": 3 << 29, "65536k": 64 << 20,
		"512MiB": 512 << 20, "512mb": 512 << 20, "104857600": 100 << 20}
	for in, want := range good {
		if got, err := ParseMemory(in); err != nil || got != want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "512x", "m", "-1g", "1k", "NaN", "inf", "1e30g"} {
		if _, err := ParseMemory(in); err == nil {
			t.Errorf("ParseMemory(%q) accepted", in)
		}
	}
}

func TestParseMount(t *testing.T) {
	m, err := ParseMount("/h:/s")
	if err != nil || m != (Mount{Source: "/h", Target: "/s"}) {
		t.Fatalf("default mode: %+v %v", m, err)
	}
	m, err = ParseMount("/h:/s:rw")
	if err != nil || !m.ReadWrite || m.String() != "/h:/s:rw" {
		t.Fatalf("rw: %+v %v", m, err)
	}
	for _, bad := range []string{"/h", ":/s", "/h:/s:rx", "/h:/s:ro:x"} {
		if _, err := ParseMount(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseMount(%q): %v", bad, err)
		}
	}
}

func TestParseEnv(t *testing.T) {
	env, err := ParseEnv([]string{"A=1", "B=x=y", "C="})
	if err != nil || env["A"] != "1" || env["B"] != "x=y" || env["C"] != "" || len(env) != 3 {
		t.Fatalf("%v %v", env, err)
	}
	if _, err := ParseEnv([]string{"NOVALUE", "=x"}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad pairs accepted: %v", err)
	}
}
