// Package direct opens the providers a one-shot command runs in its own process with no
// roched: docker, oci and wasm. It links their backends (the Docker client, wazero) and
// no others (client-go, firecracker's SDK): roche-run, the binary the thin roche hands
// such a command to, links it alone, and starts in a fraction of roched's time;
// internal/inproc adds the other providers for roched.
package direct

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/oci"
	"github.com/roche-sandbox/roche/provider/wasm"
)

// Constructors opens each provider of catalog.Direct, by name. A missing engine is not
// an error here: it shows as roche.ErrUnavailable on use.
var Constructors = map[string]func(catalog.Options) (roche.Provider, error){
	"docker": func(o catalog.Options) (roche.Provider, error) {
		opts := []docker.Option{docker.WithLogger(o.Log), docker.WithEngineTimeout(o.EngineTimeout), docker.WithTransport(o.Transport)}
		if o.Outlives {
			opts = append(opts, docker.WithEgressProxy())
		}
		if o.PinnedMounts {
			opts = append(opts, docker.WithPinnedMounts())
		}
		if o.Runtime != "" {
			opts = append(opts, docker.WithRuntime(o.Runtime))
		}
		return Opened(docker.New(opts...))
	},
	oci.Name: func(o catalog.Options) (roche.Provider, error) {
		opts := []oci.Option{oci.WithLogger(o.Log), oci.WithRuntime(o.OCIRuntime)}
		if o.Outlives {
			opts = append(opts, oci.WithEgressProxy())
		}
		if o.PinnedMounts {
			opts = append(opts, oci.WithPinnedLayouts())
		}
		return Opened(oci.New(opts...))
	},
	"wasm": func(o catalog.Options) (roche.Provider, error) {
		opts := []wasm.Option{wasm.WithLogger(o.Log)}
		if o.WarmStart {
			opts = append(opts, wasm.WithWarmStart())
		}
		return Opened(wasm.New(opts...))
	},
}

// Opened turns a constructor's result into a roche.Provider, so that a failed one is a
// nil interface rather than one holding a nil pointer.
func Opened[P roche.Provider](p P, err error) (roche.Provider, error) {
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Open opens the named provider, one of catalog.Direct, with o, as internal/inproc's
// Open does.
func Open(name string, o catalog.Options) (roche.Provider, error) {
	p, err := catalog.Lookup(name)
	if err != nil {
		return nil, err
	}
	newProvider, ok := Constructors[p.Name]
	if !ok || !slices.Contains(catalog.Direct, p.Name) {
		return nil, fmt.Errorf("%w: the %s provider has no constructor in this binary", roche.ErrUnsupported, p.Name)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.Log = o.Log.With("provider", p.Name)
	return newProvider(o)
}
