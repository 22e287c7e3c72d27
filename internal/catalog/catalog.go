// Package catalog is the one list of Roche's providers, which the CLI, roched and the
// MCP server all read: each provider's name, a line for help texts, how roched treats it
// when it cannot be opened, and which provider owns a sandbox id. It links no backend,
// so that the thin roche binary can read it; package internal/inproc holds how each one
// is opened, and is all that links them. Adding a provider is one entry in the list
// below and its constructor there.
package catalog

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
	"github.com/roche-sandbox/roche/internal/rocherun"
)

// Default is the provider of a create that names none.
const Default = "docker"

// Options is what a provider is opened with. Each constructor uses what applies to it.
type Options struct {
	// Log receives the provider's log, with provider=NAME added; nil discards.
	Log *slog.Logger
	// EngineTimeout bounds a create against the Docker engine (docker.WithEngineTimeout).
	// It is passed as given, so a zero or negative one is refused like any other bad
	// setting: callers set it, usually to defaults.EngineTimeout.
	EngineTimeout time.Duration
	// Transport is how commands reach Docker sandboxes, docker.TransportAgent (the
	// default, defaults.Transport) or docker.TransportDockerExec, passed as given (an
	// empty one is refused).
	Transport string
	// Outlives says this process outlives the sandboxes it makes (roched, roche run),
	// so it can serve their egress proxies (docker.WithEgressProxy,
	// kubernetes.WithEgressProxy).
	Outlives bool
	// PinnedMounts binds the host paths that were checked rather than paths a sandbox
	// could redirect in between, and opens image layouts the same way; roched sets it
	// when remote tenants may mount, and so name layouts below their mount roots
	// (docker.WithPinnedMounts, oci.WithPinnedLayouts).
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
	// LeaseGrace, when positive, is how long a leased sandbox outlives its last lease
	// holder on the providers that take it (kubernetes.WithLeaseGrace): roched replicas
	// lengthen it so that a client's Hold can move to another replica.
	LeaseGrace time.Duration
	// KubeQPS and KubeBurst, when positive, are the Kubernetes provider's API client rate
	// limit (kubernetes.WithClientRate); zero keeps its default.
	KubeQPS   float32
	KubeBurst int
	// StorageClass is the StorageClass of the Kubernetes provider's new workspaces
	// (kubernetes.WithStorageClass); empty means the cluster's default.
	StorageClass string
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

// list is every provider, sorted by name. The names are the provider packages' own
// (vm.Firecracker, kubernetes.Name, ...): internal/inproc's tests hold them to it.
var list = []Provider{
	{
		Name:        "docker",
		Description: "Linux containers on the Docker engine",
		Required:    true,
		BareIDs:     true,
	},
	{
		Name:        "firecracker",
		Description: "a Firecracker microVM per sandbox; needs KVM and firecracker",
	},
	{
		Name:         "kubernetes",
		Description:  "a Pod per sandbox on a Kubernetes cluster (--kubeconfig or KUBECONFIG)",
		CheckAtStart: true,
	},
	{
		Name:        "oci",
		Description: "containers run directly by an OCI runtime (crun or runc), no dockerd; needs root",
	},
	{
		Name:        "qemu",
		Description: "a QEMU microVM per sandbox: KVM, else emulation (slower)",
	},
	{
		Name:         "wasm",
		Description:  "CPython 3.12 on WebAssembly (wazero), in-process; needs python.wasm",
		CheckAtStart: true,
	},
}

// Direct are the providers roche-run links (internal/inproc/direct), sorted: the thin
// roche hands a command that needs only these in its own process to roche-run, which
// starts faster than roched, and any other to roched. The list lives in rocherun, which
// the thin roche reads before it initialises this package.
var Direct = rocherun.Direct

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

// NotConfiguredError says that a provider which needs setting up (the kubernetes
// provider: a cluster to talk to) was not set up at all: no flag, no environment, no
// in-cluster credentials. It is roche.ErrUnavailable; what is not set up is not a
// failure, so a list over every provider leaves it out without saying it skipped one,
// and roched serves it only when asked to (--providers, or one of its flags). One that
// was set up but does not work is another error, and is reported.
type NotConfiguredError struct {
	Provider string
	// Reason says what would set it up.
	Reason string
	// Check names what is not set up, and Fix is the command that sets it up, for roche
	// doctor ("kubeconfig", "export KUBECONFIG=..."); empty when none does.
	Check, Fix string
}

func (e *NotConfiguredError) Error() string {
	return fmt.Sprintf("%v: %s", roche.ErrUnavailable, e.Reason)
}

func (e *NotConfiguredError) Unwrap() error { return roche.ErrUnavailable }

// Is makes it roche.ErrNotConfigured, which a provider returns for what is not set up
// here, and which crosses roched's API.
func (e *NotConfiguredError) Is(target error) bool { return target == roche.ErrNotConfigured }

// NotConfigured reports whether err says a provider was not set up at all.
func NotConfigured(err error) bool {
	var nc *NotConfiguredError
	return errors.As(err, &nc)
}
