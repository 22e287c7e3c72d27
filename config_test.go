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
		c.MemoryBytes() != 512<<20 || c.CPUs != 1 || c.TimeoutSecs != 300 || c.DiskBytes() != 1<<30 || c.WorkspaceBytes() != 0 {
		t.Fatalf("defaults are not the secure ones: %+v", c)
	}
}

// TestTmpSizeLeavesTheAgentRoom: the two tmpfs mounts in a sandbox's memory never take
// more than the limit less agentMemoryReserve, and are never unbounded (size 0).
func TestTmpSizeLeavesTheAgentRoom(t *testing.T) {
	for mem, want := range map[string]int64{"512m": 64 << 20, "160m": 64 << 20, "159m": 63 << 20, "128m": 48 << 20,
		"100m": 34 << 20, "64m": 16 << 20, "33m": 1 << 20, "6m": 1 << 20} {
		c := DefaultConfig()
		c.Memory = mem
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		got := c.TmpSize()
		if got != want {
			t.Errorf("memory %s: tmpfs size %d MiB, want %d MiB", mem, got>>20, want>>20)
		}
		if mb := c.MemoryBytes(); mb > 2*agentMemoryReserve && 2*got > mb-agentMemoryReserve {
			t.Errorf("memory %s: two tmpfs of %d MiB leave the agent less than %d MiB", mem, got>>20, agentMemoryReserve>>20)
		}
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
	c.NetworkAllowlist = []string{"pypi.org/simple"}
	c.Secrets = []Secret{{Name: "HTTPS_PROXY", Value: "v", Hosts: []string{"pypi.org"}}, {Name: "T", Value: "v"}}
	err := c.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"image", "memory", "cpus", "timeout_secs", "pids_limit", "workdir", "env name", "mount source", "mount target /", "network_allowlist",
		"secret HTTPS_PROXY: the sandbox's egress settings use that variable", "secret T is bound to no host"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, err)
		}
	}
}

func TestParseMemory(t *testing.T) {
	good := map[string]int64{"512m": 512 << 20, "1g": 1 << 30, "1G": 1 << 30, "1.5g": 3 << 29, "65536k": 64 << 20,
		"512MiB": 512 << 20, "512mb": 512 << 20, "104857600": 100 << 20}
	for in, want := range good {
		if got, err := parseMemory(in); err != nil || got != want {
			t.Errorf("parseMemory(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "512x", "m", "-1g", "1k", "NaN", "inf", "1e30g"} {
		if _, err := parseMemory(in); err == nil {
			t.Errorf("parseMemory(%q) accepted", in)
		}
	}
}

func TestParseDisk(t *testing.T) {
	good := map[string]int64{"0": 0, "1g": 1 << 30, "100m": 100 << 20, "1.5G": 3 << 29, "8m": 8 << 20, "1t": 1 << 40,
		"512MiB": 512 << 20, "104857600": 100 << 20, " 2g ": 2 << 30}
	for in, want := range good {
		if got, err := parseDisk(in); err != nil || got != want {
			t.Errorf("parseDisk(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]string{
		"": "not a size", "1x": "not a size", "g": "not a size", "NaN": "not a size", "inf": "not a size",
		"-1g": "negative", "-0.5m": "negative", "1m": "minimum", "4096": "minimum",
		"2t": "maximum", "1e30g": "not a size", "0.1": "less than a byte",
	}
	for in, want := range bad {
		if _, err := parseDisk(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseDisk(%q): %v, want an error saying %q", in, err, want)
		}
	}
}

func TestValidateDisk(t *testing.T) {
	for _, tc := range []struct {
		name      string
		set       func(*Config)
		wantInErr string // "" for valid
	}{
		{"default", func(c *Config) {}, ""},
		{"no limit", func(c *Config) { c.Disk = "0"; c.Writable = true }, ""},
		{"empty disk", func(c *Config) { c.Disk = "" }, "disk: \"\" is not a size"},
		{"bad disk", func(c *Config) { c.Disk = "lots" }, "disk: \"lots\" is not a size"},
		{"negative disk", func(c *Config) { c.Disk = "-100m" }, "disk: \"-100m\" is negative"},
		{"huge disk", func(c *Config) { c.Disk = "5t" }, "disk: \"5t\" is above the 1t maximum"},
		{"workspace size", func(c *Config) { c.Workspace = "w"; c.WorkspaceSize = "50m" }, ""},
		{"workspace size without workspace", func(c *Config) { c.WorkspaceSize = "50m" }, "workspace_size is set without a workspace"},
		{"workspace size 0", func(c *Config) { c.Workspace = "w"; c.WorkspaceSize = "0" }, "workspace_size is 0"},
		{"bad workspace size", func(c *Config) { c.Workspace = "w"; c.WorkspaceSize = "2t" }, "workspace_size: \"2t\" is above"},
	} {
		c := DefaultConfig()
		tc.set(&c)
		err := c.Validate()
		if tc.wantInErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.wantInErr) {
			t.Errorf("%s: %v, want ErrInvalidConfig saying %s", tc.name, err, tc.wantInErr)
		}
	}
	c := DefaultConfig()
	c.Workspace, c.WorkspaceSize = "w", "50m"
	if c.WorkspaceBytes() != 50<<20 {
		t.Errorf("WorkspaceBytes of 50m: %d", c.WorkspaceBytes())
	}
}
