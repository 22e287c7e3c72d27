package kit

import (
	"context"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
)

// CreateOptions say for whom a program creates a sandbox and how it is bound to them:
// what roche.Config, which says what the sandbox is, leaves out, so that no user sets
// them by accident and no API caller sets them at all. roched, the CLI and a warm pool
// give them, through Create.
type CreateOptions struct {
	// Owner names who made the sandbox and so who may list, adopt and collect it:
	// "roched:INSTANCE[/TENANT]" for roched, "cli:USER@HOST" for the direct-mode CLI.
	// Providers keep it with the sandbox and report it as SandboxInfo.Owner (a Claim
	// replaces it). roched sets it for every create and its API does not carry it.
	// Empty means nobody in particular (a library caller).
	Owner string `json:"owner,omitempty"`
	// Leased ties the sandbox to its creator instead of only to its lifetime: the
	// process whose provider made it holds its lease until Destroy, Keep (see Leaser) or
	// its own end, and a sandbox whose lease is lost (its creator was killed) stops
	// within seconds. roche run, the SDKs' context managers (through roched, which
	// holds the lease for them) and roched's pools ask for it; a sandbox made to outlive
	// its creator (roche create) does not. A provider without leases
	// (Capabilities.Leases false) refuses it.
	Leased bool `json:"leased,omitempty"`
	// IdempotencyKey, when set, makes the create one that a retry may repeat: a provider
	// that keeps its sandboxes where every process sees them (kubernetes) names the
	// sandbox after Owner and the key, so that a second create with both answers with
	// the first one's sandbox instead of making another. Others ignore it (roched keeps
	// the keys it was given itself).
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// OneShot says the caller runs one command in the sandbox, in its own process, and
	// then destroys it (roche run with no roched): a provider may make the sandbox for
	// that alone (oci: its agent serves that one command on a connection made with it,
	// and ends with it), and then refuses a second command. Others ignore it, as does
	// roched's client: it is a hint about use, not a property of the sandbox.
	OneShot bool `json:"one_shot,omitempty"`
}

// LeaseHolder is a provider whose process can take the lease of a leased sandbox it did
// not make, or make again (roched replicas: a client's Hold moved to another replica),
// and let go of it. The sandbox stops its grace after the last holder, in any process,
// lets go.
type LeaseHolder interface {
	// HoldLease takes and holds sandbox id's lease until DropLease, Destroy or this
	// process's end. A sandbox not leased is refused with roche.ErrUnsupported, one
	// whose lease was already lost with roche.ErrNotFound.
	HoldLease(ctx context.Context, id string) error
	// DropLease lets go of the lease held here, if any.
	DropLease(id string)
}

// Elector is a provider whose backend can elect one leader among the processes sharing
// it (roched replicas): a Kubernetes Lease object.
type Elector interface {
	// Elect campaigns, until ctx ends, to lead group as identity, with leases of the
	// given duration (0: the provider's default). leading reports whether this process
	// leads now; a process that stops leading says so within the lease's duration.
	Elect(ctx context.Context, group, identity string, lease time.Duration) (leading func() bool, err error)
}

// Creator is a provider that creates with CreateOptions; every provider of this
// repository is one, its Create being CreateFor with none. A wrapper that embeds a
// provider to watch its creates must wrap CreateFor, which Create calls, and not only
// Create: the embedded CreateFor would otherwise serve them unseen.
type Creator interface {
	// CreateFor is roche.Provider's Create for opts.Owner, leased with opts.Leased.
	CreateFor(ctx context.Context, cfg roche.Config, opts CreateOptions) (roche.SandboxInfo, error)
}

// Create makes a sandbox on p with opts: through p's CreateFor, or p's Create when
// there are no options to give. Options a provider cannot take are refused with
// roche.ErrUnsupported, never dropped: a sandbox made without its owner or its lease
// would outlive what it should, unseen by whoever should reap it.
func Create(ctx context.Context, p roche.Provider, cfg roche.Config, opts CreateOptions) (roche.SandboxInfo, error) {
	if c, ok := p.(Creator); ok {
		return c.CreateFor(ctx, cfg, opts)
	}
	// OneShot is only a hint: without it, such a provider makes the sandbox as usual.
	if opts.OneShot = false; opts != (CreateOptions{}) {
		return roche.SandboxInfo{}, fmt.Errorf("%w: provider %s cannot make a sandbox for an owner or with a lease (it is no kit.Creator)", roche.ErrUnsupported, p.Name())
	}
	return p.Create(ctx, cfg)
}

// Spec is a sandbox as a provider makes it and keeps it: its Config with the
// CreateOptions it was made with. Its JSON is the Config's fields with "owner" and
// "leased" among them, as providers' records have always held them.
type Spec struct {
	roche.Config
	CreateOptions
}
