package pool

import (
	"errors"
	"testing"

	"github.com/roche-sandbox/roche"
)

// FuzzParseSpec parses any --pool spec: one that parses is valid, its sandboxes' config
// is valid, it prints back to a spec that parses to the same, and a create asking for
// the pool's image and limits within its timeout is served by it.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"docker/roche/python:local?min=2&max=5&total=20&queue=64&wait=3&idle_timeout=600",
		"docker/img", "docker/img?code=python", "wasm/python?memory=1g&cpus=0.5&pids_limit=32&timeout=60",
		"docker/img?idle_timeout=10m&wait=0.5", "docker/img?idle_timeout=2562047h", "docker/img?timeout=9223372036854775807",
		"docker/img?wait=1e-9&queue=1", "docker/img?min=-1", "docker/img?max=0&min=1", "docker/img?bogus=1",
		"docker/img?min=1&min=2", "docker/img?memory=%00", "/img", "docker/", "docker/img?%zz", "docker/a/b:c@sha256:00?min=0",
		"docker/img?cpus=NaN", "docker/img?cpus=1e308", "docker/img?idle_timeout=0.000000001",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseSpec(s)
		if err != nil {
			if !errors.Is(err, roche.ErrInvalidConfig) {
				t.Fatalf("ParseSpec(%q): %v does not wrap ErrInvalidConfig", s, err)
			}
			return
		}
		if err := spec.Validate(); err != nil {
			t.Fatalf("ParseSpec(%q) passed a spec that does not validate: %v", s, err)
		}
		cfg := spec.Config()
		if err := cfg.Validate(); err != nil {
			t.Fatalf("ParseSpec(%q): the pooled sandboxes' config does not validate: %v", s, err)
		}
		if cfg.TimeoutSecs < spec.MaxTimeoutSecs {
			t.Fatalf("ParseSpec(%q): pooled sandboxes live %d s, less than the %d s a create may ask", s, cfg.TimeoutSecs, spec.MaxTimeoutSecs)
		}
		again, err := ParseSpec(spec.String())
		if err != nil || again != spec {
			t.Fatalf("ParseSpec(%q) = %+v, which prints as %q, which parses to %+v (%v)", s, spec, spec.String(), again, err)
		}
		create := roche.DefaultConfig()
		create.Image, create.Memory, create.CPUs, create.PidsLimit = spec.Image, spec.Memory, spec.CPUs, spec.PidsLimit
		create.TimeoutSecs = min(spec.MaxTimeoutSecs, create.TimeoutSecs)
		if create.Validate() == nil && !spec.Matches(spec.Provider, create) {
			t.Fatalf("ParseSpec(%q): a create for its image and limits is not served by it", s)
		}
	})
}
