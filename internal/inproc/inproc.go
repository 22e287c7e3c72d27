// Package inproc opens Roche's providers inside this process: the constructor of every
// provider internal/catalog lists. It is what links the backends (the Docker client,
// client-go, wazero, ...), whose package initialisation alone costs a process some
// 12 ms, so only roched links it: to serve them, and to run as the full roche CLI when
// started under that name (internal/cli/full). The thin roche binary does not, and hands
// a command that needs a provider in-process to roched.
package inproc

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"

	"k8s.io/client-go/rest"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/inproc/direct"
	"github.com/roche-sandbox/roche/provider/kubernetes"
	"github.com/roche-sandbox/roche/provider/vm"
)

// constructors opens each provider of providers.All, by name. A missing engine or
// hypervisor is not an error here: it shows as roche.ErrUnavailable on use.
var constructors = func() map[string]func(catalog.Options) (roche.Provider, error) {
	m := maps.Clone(direct.Constructors)
	for name, c := range others {
		m[name] = c
	}
	return m
}()

// others are the providers beyond internal/inproc/direct's (roche-run's): only roched
// links them.
var others = map[string]func(catalog.Options) (roche.Provider, error){
	vm.Firecracker: func(o catalog.Options) (roche.Provider, error) {
		return direct.Opened(vm.NewFirecracker(vm.WithLogger(o.Log)))
	}, kubernetes.Name: func(o catalog.Options) (roche.Provider, error) {
		if o.Runtime != "" && o.Runtime != "runc" && o.RuntimeClass == "" {
			// Asked for a stronger runtime that does not reach Pods: refused, never run
			// under the node's default instead.
			return nil, fmt.Errorf("%w: --runtime %s is the Docker provider's runtime and does not reach Pods: for %s Pods give --runtime-class NAME, a RuntimeClass whose handler runs it (kubectl get runtimeclass lists the cluster's), or leave --runtime out",
				roche.ErrInvalidConfig, o.Runtime, o.Runtime)
		}
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
		if o.LeaseGrace > 0 {
			opts = append(opts, kubernetes.WithLeaseGrace(o.LeaseGrace))
		}
		if o.StorageClass != "" {
			opts = append(opts, kubernetes.WithStorageClass(o.StorageClass))
		}
		if o.KubeQPS != 0 || o.KubeBurst != 0 {
			opts = append(opts, kubernetes.WithClientRate(o.KubeQPS, o.KubeBurst))
		}
		return direct.Opened(kubernetes.New(opts...))
	}, vm.QEMU: func(o catalog.Options) (roche.Provider, error) {
		opts := []vm.Option{vm.WithLogger(o.Log)}
		if o.Outlives {
			opts = append(opts, vm.WithEgressProxy())
		}
		return direct.Opened(vm.NewQEMU(opts...))
	}}

// unconfigured says, for a provider that needs setting up, why the operator has not set
// it up at all (a providers.NotConfiguredError), or nil when it has been.
var unconfigured = map[string]func(catalog.Options) error{
	// As the provider finds its cluster: --kubeconfig, else $KUBECONFIG, else the
	// in-cluster configuration (kubernetes.WithKubeconfig).
	kubernetes.Name: func(o catalog.Options) error {
		if o.Kubeconfig != "" || os.Getenv("KUBECONFIG") != "" {
			return nil
		}
		if _, err := rest.InClusterConfig(); err == nil {
			return nil
		}
		return &catalog.NotConfiguredError{Provider: kubernetes.Name,
			Reason: "no Kubernetes cluster configured: pass --kubeconfig, set KUBECONFIG, or run inside a cluster",
			Check:  "kubeconfig", Fix: kubernetes.KubeconfigFix}
	},
}

// Open opens the named provider with o; one that needs setting up and was not is a
// providers.NotConfiguredError.
func Open(name string, o catalog.Options) (roche.Provider, error) {
	p, err := catalog.Lookup(name)
	if err != nil {
		return nil, err
	}
	return open(p, o)
}

func open(p catalog.Provider, o catalog.Options) (roche.Provider, error) {
	if check, ok := unconfigured[p.Name]; ok {
		if err := check(o); err != nil {
			return nil, err
		}
	}
	newProvider, ok := constructors[p.Name]
	if !ok {
		return nil, fmt.Errorf("%w: the %s provider has no constructor in this binary", roche.ErrUnsupported, p.Name)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.Log = o.Log.With("provider", p.Name)
	return newProvider(o)
}

// Serve opens every provider (or those o.Only names) for a process that serves them
// (roched), logging to o.Log why it leaves one out. A Required provider that cannot be
// opened is an error, and so is a provider asked for (named in o.Only, or one of its
// settings given) that was not set up at all (kubernetes without a cluster); one not
// asked for is left out with a line in the log, so that lists over every provider
// answer with the others'. Any other provider that cannot be opened is left out with a
// warning, and one that opens but fails its start-up check (wasm without python.wasm)
// is served with a warning, its creates failing with ErrUnavailable and what to install.
// A setting for no provider served is refused (providers.CheckSettings).
//
// leftOut holds the providers left out with a warning, and why, for roched's /healthz.
func Serve(o catalog.Options) (set catalog.Set, leftOut map[string]error, err error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	served := catalog.Names()
	if len(o.Only) > 0 {
		served = o.Only
	}
	if err := catalog.CheckSettings(o, served, "roched serves only"); err != nil {
		return nil, nil, err
	}
	set = catalog.Set{}
	leftOut = map[string]error{}
	for _, p := range catalog.All() {
		if !slices.Contains(served, p.Name) {
			continue
		}
		rp, err := open(p, o)
		if catalog.NotConfigured(err) {
			why := "--providers names it"
			if given := catalog.Given(o, p.Name); len(given) > 0 {
				why = given[0].String() + " asks for it"
			}
			if slices.Contains(o.Only, p.Name) || catalog.Asked(o, p.Name) {
				set.Close()
				return nil, nil, fmt.Errorf("the %s provider is not set up, and %s: %w", p.Name, why, err)
			}
			log.Info(p.Name+" provider not configured: serving without it", "provider", p.Name, "reason", err)
			continue
		}
		if err != nil {
			if p.Required {
				set.Close()
				return nil, nil, err
			}
			log.Warn(p.Name+" provider unavailable: serving without it", "provider", p.Name, "err", err)
			leftOut[p.Name] = err
			continue
		}
		if c, ok := rp.(interface{ Available() error }); ok && p.CheckAtStart {
			if err := c.Available(); err != nil {
				log.Warn(p.Name+" provider unavailable: serving it, its creates failing until this is fixed", "provider", p.Name, "err", err)
			}
		}
		set[p.Name] = rp
	}
	return set, leftOut, nil
}
