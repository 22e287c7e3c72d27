package roche

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestConfigLimits: each maximum is accepted at the limit and refused past it, with a
// message naming the field and the limit.
func TestConfigLimits(t *testing.T) {
	cases := []struct {
		name      string
		atLimit   func(*Config)
		overLimit func(*Config)
		want      []string
	}{
		{"timeout", func(c *Config) { c.TimeoutSecs = MaxTimeoutSecs }, func(c *Config) { c.TimeoutSecs = 9999999999 }, []string{"timeout_secs 9999999999", "limit of 86400"}},
		{"memory", func(c *Config) { c.Memory = "64g" }, func(c *Config) { c.Memory = "999999999g" }, []string{`memory "999999999g"`, "limit of 64 GiB"}},
		{"cpus", func(c *Config) { c.CPUs = MaxCPUs }, func(c *Config) { c.CPUs = 65 }, []string{"cpus 65", "limit of 64"}},
		{"pids", func(c *Config) { c.PidsLimit = MaxPidsLimit }, func(c *Config) { c.PidsLimit = MaxPidsLimit + 1 }, []string{"pids_limit 32769", "limit of 32768"}},
		{"env total", func(c *Config) { c.Env = envOf(MaxEnvBytes) }, func(c *Config) { c.Env = envOf(MaxEnvBytes + 1) }, []string{"env is 131073 bytes", "limit of 128 KiB"}},
		{"env entry", func(c *Config) { c.Env = map[string]string{"K": strings.Repeat("v", MaxArgBytes-2)} },
			func(c *Config) { c.Env = map[string]string{"K": strings.Repeat("v", MaxArgBytes-1)} }, []string{"env K is 131072 bytes", "limit of 131071 bytes"}},
		{"image", func(c *Config) { c.Image = strings.Repeat("i", MaxNameBytes) }, func(c *Config) { c.Image = strings.Repeat("i", MaxNameBytes+1) }, []string{"image is 1025 bytes", "limit of 1024"}},
		{"workdir", func(c *Config) { c.Workdir = "/" + strings.Repeat("w", MaxPathBytes-1) }, func(c *Config) { c.Workdir = "/" + strings.Repeat("w", MaxPathBytes) }, []string{"workdir is 4097 bytes", "limit of 4096"}},
		{"mounts", func(c *Config) { c.Mounts = mountsOf(MaxMounts) }, func(c *Config) { c.Mounts = mountsOf(MaxMounts + 1) }, []string{"mounts has 65 entries", "limit of 64"}},
		{"allowlist", func(c *Config) { c.NetworkAllowlist = hostsOf(MaxAllowlist) }, func(c *Config) { c.NetworkAllowlist = hostsOf(MaxAllowlist + 1) }, []string{"network_allowlist has 65 entries", "limit of 64"}},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.atLimit(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s at the limit refused: %v", tc.name, err)
		}
		c = DefaultConfig()
		tc.overLimit(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s over the limit: %v, want ErrInvalidConfig", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}
}

func TestExecRequestLimits(t *testing.T) {
	ok := ExecRequest{Cmd: []string{"true"}}
	cases := []struct {
		name    string
		atLimit func(*ExecRequest)
		over    func(*ExecRequest)
		want    []string
	}{
		{"empty", nil, func(r *ExecRequest) { r.Cmd = nil }, []string{"empty command"}},
		{"argv total", func(r *ExecRequest) { r.Cmd = argvOf(MaxArgvBytes) }, func(r *ExecRequest) { r.Cmd = argvOf(MaxArgvBytes + 1) }, []string{"cmd is 524289 bytes", "limit of 512 KiB"}},
		{"one arg", func(r *ExecRequest) { r.Cmd = []string{strings.Repeat("a", MaxArgBytes)} }, func(r *ExecRequest) { r.Cmd = []string{"x", strings.Repeat("a", MaxArgBytes+1)} }, []string{"cmd[1] is 131072 bytes", "limit of 131071 bytes"}},
		{"nul", nil, func(r *ExecRequest) { r.Cmd = []string{"a\x00b"} }, []string{"cmd[0] contains a NUL"}},
		{"env", func(r *ExecRequest) { r.Env = envOf(MaxEnvBytes) }, func(r *ExecRequest) { r.Env = envOf(10 << 20) }, []string{"env is 10485760 bytes", "limit of 128 KiB"}},
		{"timeout", func(r *ExecRequest) { r.Timeout = MaxExecTimeout }, func(r *ExecRequest) { r.Timeout = MaxExecTimeout + time.Second }, []string{"timeout_secs 86401", "limit of 86400"}},
		{"negative timeout", nil, func(r *ExecRequest) { r.Timeout = -time.Second }, []string{"timeout_secs -1"}},
		{"output", func(r *ExecRequest) { r.OutputLimit = MaxOutputLimit }, func(r *ExecRequest) { r.OutputLimit = 512 << 20 }, []string{"output_limit 536870912", "limit of 64 MiB per stream"}},
		{"negative output", nil, func(r *ExecRequest) { r.OutputLimit = -1 }, []string{"output_limit -1 is negative"}},
		{"workdir", nil, func(r *ExecRequest) { r.Workdir = "rel" }, []string{`workdir "rel" is not absolute`}},
	}
	for _, tc := range cases {
		if tc.atLimit != nil {
			r := ok
			tc.atLimit(&r)
			if err := r.Validate(); err != nil {
				t.Errorf("%s at the limit refused: %v", tc.name, err)
			}
		}
		r := ok
		tc.over(&r)
		err := r.Validate()
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", tc.name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}
}

// envOf is an environment of exactly n bytes as envBytes counts them, in entries the
// kernel accepts (each under 64 KiB).
func envOf(n int) map[string]string {
	count := (n + 64<<10 - 1) / (64 << 10)
	env := map[string]string{}
	for i := 0; i < count; i++ {
		size := n / count
		if i < n%count {
			size++
		}
		k := fmt.Sprintf("K%08d", i)
		env[k] = strings.Repeat("v", size-len(k)-1)
	}
	return env
}

func argvOf(n int) []string {
	var argv []string
	for n > 0 {
		size := min(n, 64<<10)
		argv = append(argv, strings.Repeat("a", size))
		n -= size
	}
	return argv
}

func mountsOf(n int) []Mount {
	ms := make([]Mount, n)
	for i := range ms {
		ms[i] = Mount{Source: "/src", Target: "/m/" + strings.Repeat("x", i+1)}
	}
	return ms
}

func hostsOf(n int) []string {
	hs := make([]string, n)
	for i := range hs {
		hs[i] = strings.Repeat("h", i+1) + ".example.com"
	}
	return hs
}
