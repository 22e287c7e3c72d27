// Package providers is the one list of Roche's providers, which the CLI, roched and the
// MCP server all read: each provider's name, a line for help texts, how it is opened,
// how roched treats it when it cannot be, and which provider owns a sandbox id. Adding
// a provider is one entry in the list below. The core package roche imports no backend;
// this package imports them all.
package providers

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kubernetes"
	"github.com/roche-sandbox/roche/provider/oci"
	"github.com/roche-sandbox/roche/provider/vm"
	"github.com/roche-sandbox/roche/provider/wasm"
)

// Default is the provider of a create that names none.
const Default = "docker"

// Options is what a provider is opened with. Each constructor uses what applies to it.
type Options struct {
	// Log receives the provider's log, with provider=NAME added; nil discards.
	Log *slog.Logger
	// EngineTimeout bounds a create against the Docker engine (docker.WithEngineTimeout).
	// It is passed as given, so a zero or negative one is refused like any other bad
	// setting: callers set it, usually to docker.DefaultEngineTimeout.
	EngineTimeout time.Duration
	// Transport is how commands reach Docker sandboxes, docker.TransportAgent or
	// docker.TransportDockerExec, passed as given (an empty one is refused).
	Transport string
	// Outlives says this process outlives the sandboxes it makes (roched, roche run),
	// so it can serve their egress proxies (docker.WithEgressProxy,
	// kubernetes.WithEgressProxy).
	Outlives bool
	// PinnedMounts binds the host paths that were checked rather than paths a sandbox
	// could redirect in between; roched sets it when remote tenants may mount
	// (docker.WithPinnedMounts).
	PinnedMounts bool
	// WarmStart compiles python.wasm in the background and starts each sandbox's
	// interpreter ahead of its next exec, which pays off only in a process that lives
	// on (wasm.WithWarmStart).
	WarmStart bool
	// Kubeconfig, Namespace, RuntimeClass and SeccompProfile configure the Kubernetes
	// provider (kubernetes.WithKubeconfig, WithNamespace, WithRuntimeClass,
	// WithSeccompProfile); empty means its default ($KUBECONFIG or the in-cluster
	// configuration, namespace "roche", none, the runtime's default profile).
	Kubeconfig, Namespace, RuntimeClass, SeccompProfile string
	// Only, when given, names the providers Serve opens (roched --providers); the others
	// are not opened at all, Required ones included.
	Only []string
	// Runtime is the engine runtime Docker sandboxes run on (docker.WithRuntime):
	// docker.RuntimeRunc, or docker.RuntimeGVisor once registered (scripts/runsc.sh);
	// empty means runc.
	Runtime string
	// AgentImage is the Kubernetes provider's agent image as the nodes know it
	// (kubernetes.WithAgentImage): an operator's registry copy; empty means the local
	// roche-agent's own reference.
	AgentImage string
	// OCIRuntime is the oci provider's OCI runtime (oci.WithRuntime: crun or runc);
	// empty takes the fastest that works on the host.
	OCIRuntime string
}

// Provider is one entry of the list.
type Provider struct {
	// Name is what --provider, pool specs and the API call it.
	Name string
	// Description is one line for help texts.
	Description string
	// New opens the provider. A missing engine or hypervisor is not an error here: it
	// shows as roche.ErrUnavailable on use.
	New func(Options) (roche.Provider, error)
	// Required: roched does not start when it cannot be opened. Its constructor fails
	// only on bad settings (a transport, an engine timeout, DOCKER_HOST), which an
	// operator must hear of, and it serves creates that name no provider.
	Required bool
	// CheckAtStart: roched asks its Available at start-up and logs why it is not, as it
	// is cheap (a file looked for). The others report what is missing on first use.
	CheckAtStart bool
	// BareIDs: its sandbox ids carry no name prefix (Docker's container ids). Every
	// other provider's ids start with its name and a dash ("wasm-..."), so that an id
	// alone says where the sandbox lives.
	BareIDs bool
}

// list is every provider, sorted by name.
var list = []Provider{
	{
		Name:        "docker",
		Description: "Linux containers on the Docker engine",
		New: func(o Options) (roche.Provider, error) {
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
			return opened(docker.New(opts...))
		},
		Required: true,
		BareIDs:  true,
	},
	{
		Name:        vm.Firecracker,
		Description: "a Firecracker microVM per sandbox; needs KVM and firecracker",
		New: func(o Options) (roche.Provider, error) {
			return opened(vm.NewFirecracker(vm.WithLogger(o.Log)))
		},
	},
	{
		Name:        kubernetes.Name,
		Description: "a Pod per sandbox on a Kubernetes cluster (--kubeconfig or KUBECONFIG)",
		New: func(o Options) (roche.Provider, error) {
			opts := []kubernetes.Option{kubernetes.WithLogger(o.Log), kubernetes.WithKubeconfig(o.Kubeconfig)}
			if o.Namespace != "" {
				opts = append(opts, kubernetes.WithNamespace(o.Namespace))
			}
			if o.RuntimeClass != "" {
				opts = append(opts, kubernetes.WithRuntimeClass(o.RuntimeClass))
			}
			if o.AgentImage != "" {
				opts = append(opts, kubernetes.WithAgentImage(o.AgentImage))
			}
			if o.SeccompProfile != "" {
				opts = append(opts, kubernetes.WithSeccompProfile(o.SeccompProfile))
			}
			if o.Outlives {
				opts = append(opts, kubernetes.WithEgressProxy())
			}
			return opened(kubernetes.New(opts...))
		},
		CheckAtStart: true,
	},
	{
		Name:        oci.Name,
		Description: "containers run directly by an OCI runtime (crun or runc), no dockerd; needs root",
		New: func(o Options) (roche.Provider, error) {
			opts := []oci.Option{oci.WithLogger(o.Log), oci.WithRuntime(o.OCIRuntime)}
			if o.Outlives {
				opts = append(opts, oci.WithEgressProxy())
			}
			return opened(oci.New(opts...))
		},
	},
	{
		Name:        vm.QEMU,
		Description: "a QEMU microVM per sandbox: KVM, else emulation (slower)",
		New: func(o Options) (roche.Provider, error) {
			return opened(vm.NewQEMU(vm.WithLogger(o.Log)))
		},
	},
	{
		Name:        "wasm",
		Description: "CPython 3.12 on WebAssembly (wazero), in-process; needs python.wasm",
		New: func(o Options) (roche.Provider, error) {
			opts := []wasm.Option{wasm.WithLogger(o.Log)}
			if o.WarmStart {
				opts = append(opts, wasm.WithWarmStart())
			}
			return opened(wasm.New(opts...))
		},
		CheckAtStart: true,
	},
}

// opened turns a constructor's result into a roche.Provider, so that a failed one is a
// nil interface rather than one holding a nil pointer.
func opened[P roche.Provider](p P, err error) (roche.Provider, error) {
	if err != nil {
		return nil, err
	}
	return p, nil
}

// All returns every provider, sorted by name.
func All() []Provider { return slices.Clone(list) }

// Names returns the providers' names, sorted.
func Names() []string {
	names := make([]string, len(list))
	for i, p := range list {
		names[i] = p.Name
	}
	return names
}

// List is Names for a sentence: "docker, firecracker, oci, qemu, wasm".
func List() string { return strings.Join(Names(), ", ") }

// Help is the providers as an indented table for help texts, one line each, the
// default marked.
func Help() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, p := range list {
		desc := p.Description
		if p.Name == Default {
			desc += " (the default)"
		}
		fmt.Fprintf(w, "  %s\t%s\n", p.Name, desc)
	}
	w.Flush()
	return strings.TrimSuffix(b.String(), "\n")
}

// Lookup returns the named provider; an unknown name is roche.ErrInvalidConfig with
// the names to choose from.
func Lookup(name string) (Provider, error) {
	for _, p := range list {
		if p.Name == name {
			return p, nil
		}
	}
	return Provider{}, fmt.Errorf("%w: unknown provider %q: choose one of %s", roche.ErrInvalidConfig, name, List())
}

// Check refuses names that are not providers, every one in one error.
func Check(names []string) error {
	var errs []error
	for _, n := range names {
		if _, err := Lookup(n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Open opens the named provider with o.
func Open(name string, o Options) (roche.Provider, error) {
	p, err := Lookup(name)
	if err != nil {
		return nil, err
	}
	return p.open(o)
}

func (p Provider) open(o Options) (roche.Provider, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.Log = o.Log.With("provider", p.Name)
	return p.New(o)
}

// OfID names the provider that owns a sandbox id: the one whose name and a dash start
// it, else the one whose ids are bare (Docker).
func OfID(id string) string {
	bare := Default
	for _, p := range list {
		if p.BareIDs {
			bare = p.Name
		} else if strings.HasPrefix(id, p.Name+"-") {
			return p.Name
		}
	}
	return bare
}

// Set is the providers a process opened, by name.
type Set map[string]roche.Provider

// Close closes every provider of the set that holds resources.
func (s Set) Close() error {
	var errs []error
	for name, p := range s {
		if c, ok := p.(io.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("closing the %s provider: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Serve opens every provider (or those o.Only names) for a process that serves them
// (roched), logging to
// o.Log why it leaves one out. A Required provider that cannot be opened is an error,
// as is nothing else: any other is left out with a warning, and one that opens but
// fails its start-up check (wasm without python.wasm) is served with a warning, its
// creates failing with ErrUnavailable and what to install.
func Serve(o Options) (Set, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	set := Set{}
	for _, p := range list {
		if len(o.Only) > 0 && !slices.Contains(o.Only, p.Name) {
			continue
		}
		rp, err := p.open(o)
		if err != nil {
			if p.Required {
				set.Close()
				return nil, err
			}
			log.Warn(p.Name+" provider unavailable: serving without it", "provider", p.Name, "err", err)
			continue
		}
		if c, ok := rp.(interface{ Available() error }); ok && p.CheckAtStart {
			if err := c.Available(); err != nil {
				log.Warn(p.Name+" provider unavailable: serving it, its creates failing until this is fixed", "provider", p.Name, "err", err)
			}
		}
		set[p.Name] = rp
	}
	return set, nil
}
