package roche

import (
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche/internal/size"
)

// Maxima of every field a caller controls, one per row of the table in docs/limits.md.
// They are checked in one place (Config.Validate, ExecRequest.Validate), so the CLI,
// roched, the Go client and every provider refuse the same requests with the same words,
// and so that no request can make roched or an engine hold, store or wait for more.
const (
	// MaxTimeoutSecs bounds a sandbox's lifetime (Config.TimeoutSecs): one day.
	MaxTimeoutSecs = 24 * 60 * 60
	// MaxMemory bounds Config.Memory.
	MaxMemory = 64 << 30
	// MaxCPUs bounds Config.CPUs.
	MaxCPUs = 64
	// MaxPidsLimit bounds Config.PidsLimit (the kernel's default pid_max).
	MaxPidsLimit = 32768
	// MaxEnvBytes bounds an environment (Config.Env, and ExecRequest.Env): its KEY=VALUE
	// strings' bytes summed. With MaxArgvBytes it keeps a command within the kernel's
	// limit on what one execve may carry.
	MaxEnvBytes = 128 << 10
	// MaxArgBytes bounds one argument or one KEY=VALUE string: the kernel refuses longer
	// ones (MAX_ARG_STRLEN, 128 KiB with the terminating NUL).
	MaxArgBytes = 128<<10 - 1
	// MaxArgvBytes bounds a command's argv (ExecRequest.Cmd), its strings' bytes summed.
	MaxArgvBytes = 512 << 10
	// MaxOutputLimit bounds ExecRequest.OutputLimit, the output kept per stream.
	MaxOutputLimit = 64 << 20
	// MaxExecTimeout bounds ExecRequest.Timeout.
	MaxExecTimeout = 24 * time.Hour
	// MaxStdinBytes bounds the stdin an API call carries whole (roched's Exec); a
	// provider in-process streams stdin and has no such bound.
	MaxStdinBytes = 16 << 20
	// MaxPathBytes bounds a path: a workdir, a mount's source or target (PATH_MAX).
	MaxPathBytes = 4096
	// MaxNameBytes bounds an image reference and a user.
	MaxNameBytes = 1024
	// MaxMounts bounds Config.Mounts.
	MaxMounts = 64
	// MaxAllowlist bounds Config.NetworkAllowlist, and each secret's hosts.
	MaxAllowlist = 64
	// MaxSecrets bounds Config.Secrets, MaxSecretBytes each value.
	MaxSecrets     = 16
	MaxSecretBytes = 8 << 10
)

// envBytes is the size of an environment as the limits count it: its KEY=VALUE
// strings' bytes summed.
func envBytes(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + 1 + len(v)
	}
	return n
}

// envProblems checks an environment named field ("env") against the limits.
func envProblems(field string, env map[string]string) []string {
	var problems []string
	for k, v := range env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			problems = append(problems, fmt.Sprintf("%s name %q is invalid: names are non-empty and contain no '=' or NUL", field, k))
		case strings.ContainsRune(v, 0):
			problems = append(problems, fmt.Sprintf("%s %s contains a NUL byte, which no program can receive", field, k))
		case len(k)+1+len(v) > MaxArgBytes:
			problems = append(problems, fmt.Sprintf("%s %s is %d bytes, over the limit of %d bytes for one KEY=VALUE (the kernel's)", field, k, len(k)+1+len(v), MaxArgBytes))
		}
	}
	if n := envBytes(env); n > MaxEnvBytes {
		problems = append(problems, fmt.Sprintf("%s is %d bytes, over the limit of %s: pass large data as a file (roche cp) instead", field, n, size.String(MaxEnvBytes)))
	}
	return problems
}

// limitProblems checks the config against the maxima; Validate reports them with the rest.
func (c Config) limitProblems() []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if c.TimeoutSecs > MaxTimeoutSecs {
		add("timeout_secs %d is over the limit of %d (24 h)", c.TimeoutSecs, MaxTimeoutSecs)
	}
	if n, err := parseMemory(c.Memory); err == nil && n > MaxMemory {
		add("memory %q is over the limit of %s", c.Memory, size.String(MaxMemory))
	}
	if c.CPUs > MaxCPUs && !math.IsInf(c.CPUs, 0) {
		add("cpus %v is over the limit of %d", c.CPUs, MaxCPUs)
	}
	if c.PidsLimit > MaxPidsLimit {
		add("pids_limit %d is over the limit of %d", c.PidsLimit, MaxPidsLimit)
	}
	if len(c.Image) > MaxNameBytes {
		add("image is %d bytes, over the limit of %d", len(c.Image), MaxNameBytes)
	}
	if len(c.User) > MaxNameBytes {
		add("user is %d bytes, over the limit of %d", len(c.User), MaxNameBytes)
	}
	if len(c.Workdir) > MaxPathBytes {
		add("workdir is %d bytes, over the limit of %d", len(c.Workdir), MaxPathBytes)
	}
	if len(c.Mounts) > MaxMounts {
		add("mounts has %d entries, over the limit of %d", len(c.Mounts), MaxMounts)
	}
	for _, m := range c.Mounts {
		if len(m.Source) > MaxPathBytes || len(m.Target) > MaxPathBytes {
			add("a mount path is over the limit of %d bytes", MaxPathBytes)
			break
		}
	}
	if len(c.NetworkAllowlist) > MaxAllowlist {
		add("network_allowlist has %d entries, over the limit of %d", len(c.NetworkAllowlist), MaxAllowlist)
	}
	if len(c.Secrets) > MaxSecrets {
		add("secrets has %d entries, over the limit of %d", len(c.Secrets), MaxSecrets)
	}
	for _, sec := range c.Secrets {
		if len(sec.Value) > MaxSecretBytes || len(sec.Hosts) > MaxAllowlist {
			add("secret %s is over the limit of %d bytes or %d hosts", sec.Name, MaxSecretBytes, MaxAllowlist)
		}
	}
	problems = append(problems, metadataProblems(c.Metadata)...)
	return append(problems, envProblems("env", c.Env)...)
}

// Validate reports every problem with the request at once, each naming the field (as
// the API names it) and the limit, joined into one error that wraps ErrInvalidConfig.
// Every provider calls it before running anything, as roched and the Go client do.
func (r ExecRequest) Validate() error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if len(r.Cmd) == 0 {
		add("empty command: give the program and its arguments")
	}
	argv := 0
	for i, a := range r.Cmd {
		argv += len(a)
		switch {
		case strings.ContainsRune(a, 0):
			add("cmd[%d] contains a NUL byte, which no program can receive", i)
		case len(a) > MaxArgBytes:
			add("cmd[%d] is %d bytes, over the limit of %d bytes for one argument (the kernel's): pass large data on stdin or as a file", i, len(a), MaxArgBytes)
		}
	}
	if argv > MaxArgvBytes {
		add("cmd is %d bytes, over the limit of %s: pass large data on stdin or as a file", argv, size.String(MaxArgvBytes))
	}
	problems = append(problems, envProblems("env", r.Env)...)
	if r.Workdir != "" && !path.IsAbs(r.Workdir) {
		add("workdir %q is not absolute: give a path starting with /", r.Workdir)
	} else if len(r.Workdir) > MaxPathBytes {
		add("workdir is %d bytes, over the limit of %d", len(r.Workdir), MaxPathBytes)
	}
	if r.Timeout < 0 {
		add("timeout_secs %s: give seconds > 0, or 0 for the sandbox's lifetime", seconds(r.Timeout.Seconds()))
	} else if r.Timeout > MaxExecTimeout {
		add("timeout_secs %s is over the limit of %d (24 h)", seconds(r.Timeout.Seconds()), int(MaxExecTimeout.Seconds()))
	}
	if r.OutputLimit < 0 {
		add("output_limit %d is negative: give bytes per stream, or 0 for the default %s", r.OutputLimit, size.String(DefaultOutputLimit))
	} else if r.OutputLimit > MaxOutputLimit {
		add("output_limit %d is over the limit of %s per stream", r.OutputLimit, size.String(MaxOutputLimit))
	}
	if p := checkIdempotencyKey(r.IdempotencyKey); p != "" {
		add("%s", p)
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(problems, "; "))
}

// seconds renders a count of seconds as given, 9999999999 rather than 1e+10.
func seconds(s float64) string { return strconv.FormatFloat(s, 'f', -1, 64) }
