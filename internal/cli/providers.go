package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/defaults"
)

// registry opens providers on first use and closes them at exit: roched's view of one it
// serves, else the provider in this process (local), else, in the thin roche, which has
// none, it hands the command to roched (handoff) and does not return.
type registry struct {
	log     *slog.Logger
	local   Local
	handoff func(names ...string) error
	// outlives: see providers.Options; set by roche run before it opens a provider.
	outlives bool
	mu       sync.Mutex
	open     catalog.Set
	// remote, when set, returns roched's view of a provider it serves (nil otherwise),
	// which is then used instead of opening the provider in-process.
	remote func(name string) roche.Provider
	// remoteErr, when set, says why a roched the user named could not be used, which is
	// then an error rather than a reason to run in-process.
	remoteErr func(name string) error

	// guard, when set, may refuse to act in-process on a sandbox (one roched made).
	guard func(id string, p roche.Provider) error
	// viaDaemon are the ids forID found roched serving the provider of, by provider:
	// what directHint looks up in-process when roched says one is not found.
	viaDaemon map[string]string
	// engineTimeout and transport: see providers.Options; set by flags.
	engineTimeout time.Duration
	transport     string
	// kubeconfig, namespace and runtimeClass: see providers.Options; set by flags.
	kubeconfig, namespace, runtimeClass, seccompProfile, agentImage string
	// storageClass: the kubernetes provider's workspaces' StorageClass (--kube-storage-class).
	storageClass string
	// runtime is --runtime, the Docker provider's (providers.Options.Runtime), and
	// ociRuntime --oci-runtime, the oci provider's (providers.Options.OCIRuntime).
	runtime, ociRuntime string
}

func newRegistry(l *slog.Logger, local Local, handoff func(names ...string) error) *registry {
	return &registry{log: l, local: local, handoff: handoff, open: catalog.Set{}, engineTimeout: defaults.EngineTimeout, transport: defaults.Transport}
}

// options are what providers are opened with in this process: the flags.
func (r *registry) options() catalog.Options {
	return catalog.Options{
		Log: r.log, Outlives: r.outlives, EngineTimeout: r.engineTimeout, Transport: r.transport,
		Kubeconfig: r.kubeconfig, Namespace: r.namespace, RuntimeClass: r.runtimeClass, StorageClass: r.storageClass,
		SeccompProfile: r.seccompProfile, AgentImage: r.agentImage, Runtime: r.runtime, OCIRuntime: r.ociRuntime,
	}
}

// check refuses the flags of a provider that is not among names, those a command uses:
// that provider would never read them, and a sandbox made without an isolation flag
// asked for (--runtime runsc on an oci sandbox) is a silent downgrade.
func (r *registry) check(names ...string) error {
	return catalog.CheckSettings(r.options(), names, "this command uses")
}

// get opens the named provider for a command that uses it alone (a create, an id's
// provider), refusing the flags of others (check).
func (r *registry) get(name string) (roche.Provider, error) {
	if _, err := catalog.Lookup(name); err != nil {
		return nil, err
	}
	if err := r.check(name); err != nil {
		return nil, err
	}
	return r.use(name)
}

// use opens the named provider: roched's, when it serves it and no flag of the
// provider's is given (those apply to sandboxes this process makes), else in-process.
func (r *registry) use(name string) (roche.Provider, error) { return r.useFor(name, []string{name}) }

// useFor is use for a command that uses every provider of all: a handoff, if one is
// needed, is to a binary that has them all.
func (r *registry) useFor(name string, all []string) (roche.Provider, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.open[name]; ok {
		return p, nil
	}
	if r.remote != nil {
		if p := r.remote(name); p != nil {
			if given := catalog.Given(r.options(), name); len(given) > 0 {
				return nil, fmt.Errorf("%w: %v applies to the %s sandboxes this process makes, and roched makes them here, with its own settings (roched --help): pass --direct as well",
					roche.ErrInvalidConfig, given[0], name)
			}
			r.open[name] = p
			return p, nil
		}
		if r.remoteErr != nil {
			if err := r.remoteErr(name); err != nil {
				return nil, err
			}
		}
	}
	if _, err := catalog.Lookup(name); err != nil {
		return nil, err
	}
	if !opens(r.local, name) {
		return nil, r.handoff(all...)
	}
	p, err := r.local.Open(name, r.options())
	if err != nil {
		return nil, err
	}
	r.open[name] = p
	return p, nil
}

// prepare, in the thin roche, hands the command to roched (or to roche-run, when every
// provider of names is one it links) unless roched serves every provider of names:
// before the command has done anything, for one that uses several (a loop over
// providers or ids), which a handoff at a get in the middle would run twice. In
// roche-run it hands the command on to roched the same way when roched does not serve
// a provider of names that roche-run lacks. With every provider in this process it does
// nothing: they open on first use.
func (r *registry) prepare(names ...string) error {
	if err := r.check(names...); err != nil {
		return err
	}
	for _, n := range names {
		if opens(r.local, n) {
			continue
		}
		// Any other error is the get's to report when the command comes to it.
		if _, err := r.useFor(n, names); errors.As(err, new(handoffError)) {
			return err
		}
	}
	return nil
}

func (r *registry) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.open.Close()
}

// forID picks the provider that owns a sandbox id.
func (r *registry) forID(id string) (roche.Provider, error) {
	p, err := r.get(catalog.OfID(id))
	if err == nil && r.guard != nil {
		err = r.guard(id, p)
	}
	if err != nil {
		return nil, err
	}
	if _, remote := p.(*client.Provider); remote {
		r.mu.Lock()
		if r.viaDaemon == nil {
			r.viaDaemon = map[string]string{}
		}
		r.viaDaemon[id] = p.Name()
		r.mu.Unlock()
	}
	return p, nil
}

// each calls fn for the named provider, or for every known one when name is empty. With
// no name, providers not set up here (roche.ErrNotConfigured: no engine started, no
// cluster configured) are passed over (a machine without Docker still lists its wasm
// sandboxes); one set up but unavailable (an engine that hangs or refuses) is skipped
// too, and the result then is a *roche.PartialError naming it, after fn ran for the
// others, so that a list or count says it is incomplete. When no provider answered at
// all, the first one's error is returned.
func (r *registry) each(ctx context.Context, name string, fn func(roche.Provider) error) error {
	skipped, err := r.eachSkipping(ctx, name, fn)
	if err == nil && len(skipped) > 0 {
		return &roche.PartialError{Skipped: skipped}
	}
	return err
}

// eachSkipping is each, returning the providers set up but unavailable that it skipped
// apart from the error.
func (r *registry) eachSkipping(ctx context.Context, name string, fn func(roche.Provider) error) ([]roche.SkippedProvider, error) {
	names := []string{name}
	if name == "" {
		names = catalog.Names()
	}
	if err := r.prepare(names...); err != nil {
		return nil, err
	}
	var errs, unavailable []error
	var skipped []roche.SkippedProvider
	notConfigured := 0
	for _, n := range names {
		p, err := r.use(n)
		if err == nil {
			err = fn(p)
		}
		switch {
		case err == nil:
		case name == "" && errors.Is(err, roche.ErrNotConfigured):
			// Never set up here (kubernetes without a cluster, no Docker socket): nothing
			// of it to list, and nothing skipped.
			r.log.Debug("provider not set up here", "provider", n, "err", err)
			notConfigured++
		case name == "" && isUnavailable(err):
			unavailable = append(unavailable, err)
			skipped = append(skipped, roche.SkippedProvider{Provider: n, Err: err})
		default:
			errs = append(errs, err)
		}
	}
	if len(unavailable) > 0 && len(unavailable)+notConfigured == len(names) {
		return nil, unavailable[0]
	}
	return skipped, errors.Join(errs...)
}

// eachKeeper calls fn with the named provider, or with every one, as the T that keeps
// what ("workspaces", "snapshots"). Without a name, providers that keep none are
// skipped, including those roched serves without them.
func eachKeeper[T any](ctx context.Context, r *registry, name, what string, fn func(T) error) error {
	skipped, err := eachKeeperSkipping(ctx, r, name, what, fn)
	if err == nil && len(skipped) > 0 {
		return &roche.PartialError{Skipped: skipped}
	}
	return err
}

// eachKeeperSkipping is eachKeeper, returning the providers set up but unavailable that
// it skipped apart from the error.
func eachKeeperSkipping[T any](ctx context.Context, r *registry, name, what string, fn func(T) error) ([]roche.SkippedProvider, error) {
	return r.eachSkipping(ctx, name, func(p roche.Provider) error {
		k, ok := p.(T)
		if !ok {
			if name == "" {
				return nil
			}
			return fmt.Errorf("%w: the %s provider has no %s", roche.ErrUnsupported, p.Name(), what)
		}
		err := fn(k)
		if name == "" && errors.Is(err, roche.ErrUnsupported) {
			return nil
		}
		return err
	})
}

// removeKept removes a thing by name from the keeper named, or from whichever keeps it.
// When none had it but some provider could not be asked, the answer says so.
func removeKept[T any](ctx context.Context, r *registry, provider, what, name string, rm func(T) error) error {
	var notFound error
	removed := false
	skipped, err := eachKeeperSkipping(ctx, r, provider, what, func(k T) error {
		err := rm(k)
		if errors.Is(err, roche.ErrNotFound) {
			notFound = cmp.Or(notFound, err)
			return nil
		}
		removed = removed || err == nil
		return err
	})
	switch {
	case err != nil || removed:
		return err
	case notFound != nil && len(skipped) > 0:
		return fmt.Errorf("%w; not searched: %s: %v", notFound, skipped[0].Provider, skipped[0].Err)
	case notFound != nil:
		return notFound
	}
	return fmt.Errorf("%w: no provider here has %s", roche.ErrUnsupported, what)
}

func isUnavailable(err error) bool { return errors.Is(err, roche.ErrUnavailable) }
