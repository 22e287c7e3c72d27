package pool

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
)

// Defaults for the parameters a pool spec leaves out.
const (
	DefaultMinIdle     = 1
	DefaultIdleTimeout = 300 * time.Second
	DefaultMaxWait     = 10 * time.Second
	// lifetimeSlack is added to a pooled sandbox's lifetime so that one claimed at the
	// very end of its idle time still has its full max_timeout left.
	lifetimeSlack = 60 * time.Second
)

// Key names a pool: one per (provider, image).
type Key struct {
	Provider string
	Image    string
}

// String renders the key as "provider/image", the form the CLI and the API use.
func (k Key) String() string { return k.Provider + "/" + k.Image }

// ParseKey parses "provider/image".
func ParseKey(s string) (Key, error) {
	p, img, ok := strings.Cut(s, "/")
	if !ok || p == "" || img == "" {
		return Key{}, fmt.Errorf("%w: pool key %q: use PROVIDER/IMAGE, e.g. docker/roche/python:local", roche.ErrInvalidConfig, s)
	}
	return Key{Provider: p, Image: img}, nil
}

// Spec is a warm pool's settings, as given by `roched --pool` or a config file:
//
//	docker/roche/python:local?min=2&max=5&total=20&queue=64&wait=3&idle_timeout=600
//
// Between min and max the pool keeps as many idle sandboxes as the demand it sees calls
// for: the creates of the last ten seconds times how long making one takes.
//
// A create is served from the pool when its config differs from the pool's only in
// what can be applied when a command runs (env and workdir) and asks for a lifetime of
// at most MaxTimeoutSecs; anything else (network, writable, mounts, user, a different
// memory, cpus or pids limit) needs a sandbox made for it and goes cold. A disk limit
// bounds only a writable root, so on the pool's read-only roots any limit is served.
type Spec struct {
	Key
	// MinIdle sandboxes are kept ready (param min, default 1).
	MinIdle int
	// MaxIdle bounds the ready sandboxes, e.g. after a warmup (param max, default MinIdle).
	MaxIdle int
	// MaxTotal bounds idle, creating and handed-out pooled sandboxes together
	// (param total; 0, the default, is no bound).
	MaxTotal int
	// MaxQueue creates may wait for the pool's next sandbox when none is idle (param
	// queue; 0, the default, sends a create that finds the pool empty to make its own).
	// A create waits at most until its deadline; past the queue it is refused at once
	// (roche.ErrExhausted), so that a burst beyond what the engine can make is told so
	// instead of every create slowing the others down.
	MaxQueue int
	// MaxWait is the longest a create is expected to wait in the queue (param wait,
	// seconds or a duration; default 10 s): one that would wait longer, counting the
	// creates before it and the time the pool takes to make a sandbox, is refused at
	// once, as is one whose own deadline would pass first.
	MaxWait time.Duration
	// IdleTimeout: an idle sandbox older than this is destroyed and replaced
	// (param idle_timeout, seconds or a Go duration such as 10m; default 300 s).
	IdleTimeout time.Duration
	// MaxTimeoutSecs is the longest lifetime a create may ask for and still be served
	// from the pool (param timeout, default 300).
	MaxTimeoutSecs int
	// Memory, CPUs and PidsLimit are the pooled sandboxes' limits (params memory, cpus,
	// pids_limit; default the secure defaults). Creates must ask for the same.
	Memory    string
	CPUs      float64
	PidsLimit int
	// Code, when set (param code, e.g. python), is a language whose interpreter each
	// pooled sandbox starts before it is counted ready (kit.CodeWarmer), so that the
	// first cell run in it does not wait for one to start. The provider must serve the
	// language; the interpreter counts in the sandbox's memory.
	Code string
	// NoSnapshot (param snapshot=false) makes every pooled sandbox anew. Without it, a
	// pool whose provider restores memory snapshots (kit.Templater: qemu) makes one
	// sandbox, with its interpreter started when Code is set, saves its memory as the
	// pool's template and refills by restoring that, each restore with its own id,
	// lifetime, lease, clock and randomness.
	NoSnapshot bool
}

// params lists the query parameters ParseSpec understands, for error messages.
var params = []string{"min", "max", "total", "queue", "wait", "idle_timeout", "timeout", "memory", "cpus", "pids_limit", "code", "snapshot"}

// ParseSpec parses "provider/image?min=N&max=N&total=N&idle_timeout=SECS" (every
// parameter optional; also timeout, memory, cpus, pids_limit) and reports every
// problem at once.
func ParseSpec(s string) (Spec, error) {
	keyPart, query, _ := strings.Cut(strings.TrimSpace(s), "?")
	key, err := ParseKey(keyPart)
	if err != nil {
		return Spec{}, err
	}
	def := roche.DefaultConfig()
	spec := Spec{
		Key: key, MinIdle: DefaultMinIdle, MaxIdle: -1, IdleTimeout: DefaultIdleTimeout, MaxWait: DefaultMaxWait,
		MaxTimeoutSecs: roche.DefaultTimeoutSecs, Memory: def.Memory, CPUs: def.CPUs, PidsLimit: def.PidsLimit,
	}
	values, err := url.ParseQuery(query)
	if err != nil {
		return Spec{}, fmt.Errorf("%w: pool %q: %v", roche.ErrInvalidConfig, s, err)
	}
	var problems []string
	names := make([]string, 0, len(values))
	for name := range values {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		v := values.Get(name)
		bad := func(want string) { problems = append(problems, fmt.Sprintf("%s=%q: want %s", name, v, want)) }
		switch name {
		case "min", "max", "total", "queue", "timeout", "pids_limit":
			n, err := strconv.Atoi(v)
			if err != nil {
				bad("a whole number")
				continue
			}
			switch name {
			case "min":
				spec.MinIdle = n
			case "max":
				spec.MaxIdle = n
			case "total":
				spec.MaxTotal = n
			case "queue":
				spec.MaxQueue = n
			case "timeout":
				spec.MaxTimeoutSecs = n
			case "pids_limit":
				spec.PidsLimit = n
			}
		case "idle_timeout", "wait":
			d, err := parseSeconds(v)
			if err != nil {
				bad("seconds, e.g. 600, or a duration such as 10m")
				continue
			}
			if name == "wait" {
				spec.MaxWait = d
			} else {
				spec.IdleTimeout = d
			}
		case "memory":
			spec.Memory = v
		case "code":
			spec.Code = v
		case "snapshot":
			b, err := strconv.ParseBool(v)
			if err != nil {
				bad("true or false")
				continue
			}
			spec.NoSnapshot = !b
		case "cpus":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				bad("a number such as 0.5 or 2")
				continue
			}
			spec.CPUs = f
		default:
			problems = append(problems, fmt.Sprintf("unknown parameter %q (known: %s)", name, strings.Join(params, ", ")))
		}
	}
	if spec.MaxIdle < 0 {
		spec.MaxIdle = spec.MinIdle
	}
	if err := spec.validate(); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return Spec{}, fmt.Errorf("%w: pool %q: %s", roche.ErrInvalidConfig, s, strings.Join(problems, "; "))
	}
	return spec, nil
}

// diskMatches reports whether a sandbox made with base's disk limit serves cfg's: the
// limit bounds a writable root and nothing else (a workspace has its own size), so on a
// read-only root, which is all a pool holds, any limit will do.
func diskMatches(cfg, base roche.Config) bool {
	return !cfg.Writable && !base.Writable || cfg.DiskBytes() == base.DiskBytes()
}

// parseSeconds reads "600" or "0.5" as seconds, or a Go duration such as "10m".
func parseSeconds(v string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || f > 1e9 {
			return 0, errors.New("out of range")
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	return time.ParseDuration(v)
}

// validate reports what is wrong with the spec's numbers, joined in one error.
func (s Spec) validate() error {
	var problems []string
	if s.MinIdle < 0 {
		problems = append(problems, fmt.Sprintf("min is %d: give 0 or more", s.MinIdle))
	}
	if s.MaxIdle < s.MinIdle {
		problems = append(problems, fmt.Sprintf("max (%d) is below min (%d)", s.MaxIdle, s.MinIdle))
	}
	if s.MaxTotal < 0 {
		problems = append(problems, fmt.Sprintf("total is %d: give 0 (no bound) or more", s.MaxTotal))
	} else if s.MaxTotal > 0 && s.MaxTotal < s.MaxIdle {
		problems = append(problems, fmt.Sprintf("total (%d) is below max (%d)", s.MaxTotal, s.MaxIdle))
	}
	if s.MaxQueue < 0 {
		problems = append(problems, fmt.Sprintf("queue is %d: give 0 (no queue) or more", s.MaxQueue))
	}
	if s.MaxQueue > 0 && s.MaxWait <= 0 {
		problems = append(problems, "wait must be positive")
	}
	if s.IdleTimeout <= 0 {
		problems = append(problems, "idle_timeout must be positive")
	}
	if s.MaxTimeoutSecs <= 0 {
		problems = append(problems, fmt.Sprintf("timeout is %d: give a positive number of seconds", s.MaxTimeoutSecs))
	}
	// The pooled sandboxes' config must itself be valid (memory, cpus, pids_limit, image).
	if err := s.Config().Validate(); err != nil {
		problems = append(problems, strings.TrimPrefix(err.Error(), roche.ErrInvalidConfig.Error()+": "))
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}

// Validate reports every problem with the spec, wrapping roche.ErrInvalidConfig.
func (s Spec) Validate() error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("%w: pool %s: %v", roche.ErrInvalidConfig, s.Key, err)
	}
	return nil
}

// String renders the spec in --pool syntax, every parameter spelled out.
func (s Spec) String() string {
	v := url.Values{}
	v.Set("min", strconv.Itoa(s.MinIdle))
	v.Set("max", strconv.Itoa(s.MaxIdle))
	v.Set("total", strconv.Itoa(s.MaxTotal))
	v.Set("queue", strconv.Itoa(s.MaxQueue))
	v.Set("wait", strconv.FormatFloat(s.MaxWait.Seconds(), 'f', -1, 64))
	v.Set("idle_timeout", strconv.FormatFloat(s.IdleTimeout.Seconds(), 'f', -1, 64))
	v.Set("timeout", strconv.Itoa(s.MaxTimeoutSecs))
	v.Set("memory", s.Memory)
	v.Set("cpus", strconv.FormatFloat(s.CPUs, 'f', -1, 64))
	v.Set("pids_limit", strconv.Itoa(s.PidsLimit))
	if s.Code != "" {
		v.Set("code", s.Code)
	}
	if s.NoSnapshot {
		v.Set("snapshot", "false")
	}
	// url.Values.Encode escapes '/' and ':' in nothing here but would in an image name,
	// so only the query is encoded.
	return s.Key.String() + "?" + v.Encode()
}

// Config is the config pooled sandboxes are created with: the secure defaults with the
// pool's image and limits, and a lifetime long enough to sit idle for IdleTimeout and
// then serve a create asking for MaxTimeoutSecs. The daemon enforces each claimed
// sandbox's real, shorter expiry itself.
func (s Spec) Config() roche.Config {
	cfg := roche.DefaultConfig()
	cfg.Image = s.Image
	cfg.Memory = s.Memory
	cfg.CPUs = s.CPUs
	cfg.PidsLimit = s.PidsLimit
	cfg.TimeoutSecs = int((s.IdleTimeout + lifetimeSlack).Seconds()) + s.MaxTimeoutSecs
	return cfg
}

// Matches reports whether a create for cfg on provider can be served by this pool:
// cfg may differ from the pool's config only in Env and Workdir (applied at exec time)
// and in a lifetime of at most MaxTimeoutSecs.
func (s Spec) Matches(provider string, cfg roche.Config) bool {
	base := s.Config()
	return provider == s.Provider &&
		cfg.Image == base.Image &&
		!cfg.Network && len(cfg.NetworkAllowlist) == 0 && cfg.Workspace == "" && cfg.FromSnapshot == "" &&
		!cfg.Writable && len(cfg.Mounts) == 0 &&
		diskMatches(cfg, base) &&
		cfg.User == base.User &&
		cfg.MemoryBytes() == base.MemoryBytes() &&
		cfg.CPUs == base.CPUs &&
		cfg.PidsLimit == base.PidsLimit &&
		cfg.TimeoutSecs > 0 && cfg.TimeoutSecs <= s.MaxTimeoutSecs
}
