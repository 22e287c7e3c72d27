package ledger

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Replica groups (Config.Group): several roched serving the same sandboxes, each with
// its own state file, behind one Service. What they share lives with the sandboxes, in
// the provider (a Pod's labels and annotations):
//
//	owner    roched:replicas.GROUP/TENANT, the same whichever replica made it, so every
//	         replica serves it to TENANT: a call naming an id this replica does not
//	         track asks the provider (findShared), and List shows them all
//	end      the provider's own (roche.expires, and the agent's lifetime)
//	lease    the agent's, held by an open connection from each replica that serves a
//	         Hold of it (kit.LeaseHolder); when the last one lets go, or dies, the agent
//	         stops the sandbox its grace later
//	create   an idempotency key names the Pod (kit.CreateOptions.IdempotencyKey), so a
//	         retry through another replica finds the first create's sandbox
//
// The one replica that reaps is the leader, elected through the provider (kit.Elector,
// a Kubernetes Lease): it alone destroys expired and stopped sandboxes of the group, so
// each is reaped once; every replica reaps only the pooled sandboxes it made itself.
// Pools are sharded by replica: each fills its own, owned by it alone (its pool owner,
// as without a group), held by its own lease, so a replica that dies takes its idle
// sandboxes with it and nothing is filled twice.

// groupInstance is the instance part of a group's owner.
const groupInstance = "replicas"

var groupName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$`)

// checkGroup refuses a group over providers that cannot share their sandboxes.
func checkGroup(cfg Config, providers map[string]roche.Provider) error {
	if cfg.Group == "" {
		if cfg.Identity != "" {
			return fmt.Errorf("%w: a replica identity without a replica group: give --replica-group too", roche.ErrInvalidConfig)
		}
		return nil
	}
	if !groupName.MatchString(cfg.Group) {
		return fmt.Errorf("%w: replica group %q: use 1 to 40 lower-case letters, digits and dashes", roche.ErrInvalidConfig, cfg.Group)
	}
	for name, p := range providers {
		_, elects := p.(kit.Elector)
		_, holds := p.(kit.LeaseHolder)
		if !elects || !holds {
			return fmt.Errorf("%w: replica group %s: the %s provider keeps its sandboxes where only one roched sees them: serve only providers replicas can share (--providers=kubernetes)",
				roche.ErrInvalidConfig, cfg.Group, name)
		}
	}
	return nil
}

// grouped reports whether this ledger is one of a replica group.
func (l *Ledger) grouped() bool { return l.cfg.Group != "" }

// groupOwner is the owner every replica of the group gives its tenants' sandboxes.
func (l *Ledger) groupOwner() string { return ownerPrefix + groupInstance + "." + l.cfg.Group }

// shared reports whether r is the group's rather than this replica's alone.
func (l *Ledger) shared(r *Record) bool {
	return l.grouped() && !r.direct && r.Kind != KindPooled
}

// identity names this replica in the election.
func (l *Ledger) identity() string {
	if l.cfg.Identity != "" {
		return l.cfg.Identity
	}
	host, _ := os.Hostname()
	return host + "-" + l.instance
}

// elections are the campaigns of one replica, per provider.
type elections struct {
	cancel  context.CancelFunc
	mu      sync.Mutex
	leading map[string]func() bool
}

// elect starts campaigning to lead the group on every provider.
func (l *Ledger) elect() error {
	if !l.grouped() {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.elections = &elections{cancel: cancel, leading: map[string]func() bool{}}
	for _, name := range l.names {
		leading, err := l.providers[name].(kit.Elector).Elect(ctx, l.cfg.Group, l.identity(), l.cfg.LeaderLease)
		if err != nil {
			cancel()
			return fmt.Errorf("replica group %s: electing a leader on the %s provider: %w", l.cfg.Group, name, err)
		}
		l.elections.leading[name] = leading
	}
	l.log.Info("campaigning to lead the replica group", "group", l.cfg.Group, "identity", l.identity())
	return nil
}

// stopElections gives up leading (the next replica takes over at once).
func (l *Ledger) stopElections() {
	if l.elections != nil {
		l.elections.cancel()
	}
}

// leads reports whether this replica leads the group on the named provider.
func (l *Ledger) leads(provider string) bool {
	if l.elections == nil {
		return false
	}
	l.elections.mu.Lock()
	leading := l.elections.leading[provider]
	l.elections.mu.Unlock()
	return leading != nil && leading()
}

// mayReap reports whether this replica may destroy r at its end: a group's sandbox only
// when it leads, so that it is reaped once.
func (l *Ledger) mayReap(r *Record) bool {
	return !l.shared(r) || l.leads(r.Provider)
}

// sharedLookupTimeout bounds asking the provider for a sandbox another replica made.
const sharedLookupTimeout = 15 * time.Second

// findShared looks for id among the group's sandboxes of tenant t, asking the provider
// that owns such an id (or each one), and tracks the one it finds: one another replica
// made, or made before this one started.
func (l *Ledger) findShared(t *Tenant, id string) bool {
	if !l.grouped() || id == "" {
		return false
	}
	names := l.names
	if l.cfg.ProviderOf != nil {
		n := l.cfg.ProviderOf(id)
		if !slices.Contains(l.names, n) {
			return false
		}
		names = []string{n}
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedLookupTimeout)
	defer cancel()
	for _, n := range names {
		sb, err := l.providers[n].Inspect(ctx, id)
		if err != nil || sb.State == roche.StateExited || sb.Expired(time.Now()) {
			continue
		}
		class, tenant := l.classify(sb.Owner)
		if class != sharedOwner || tenant != t.Name {
			continue
		}
		l.mu.Lock()
		l.adoptSharedLocked(n, sb, tenant)
		l.mu.Unlock()
		return true
	}
	return false
}

// adoptSharedLocked tracks a group's sandbox found in the provider, unless tracked.
// Whether it is leased is learnt when a Hold comes (the provider's lease answers).
// Callers hold l.mu.
func (l *Ledger) adoptSharedLocked(provider string, sb roche.SandboxInfo, tenant string) *Record {
	if r, ok := l.sandboxes[sb.ID]; ok {
		return r
	}
	r := &Record{
		ID: sb.ID, Provider: provider, Image: sb.Image, Kind: KindClient, Tenant: tenant,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, Paused: sb.State == roche.StatePaused,
		adopted: true, since: time.Now(),
	}
	l.sandboxes[sb.ID] = r
	l.log.Debug("serving a sandbox of the replica group", "provider", provider, "id", sb.ID, "tenant", tenant)
	return r
}

// holdShared takes the provider's lease of a group's sandbox for a Hold that came to
// this replica (the first of its Holds here): the sandbox then lives while any replica
// holds it.
func (l *Ledger) holdShared(tg Target) error {
	lh := tg.Provider.(kit.LeaseHolder)
	ctx, cancel := context.WithTimeout(context.Background(), sharedLookupTimeout)
	defer cancel()
	err := lh.HoldLease(ctx, tg.ID)
	if errors.Is(err, roche.ErrUnsupported) {
		return fmt.Errorf("%w: sandbox %s is not leased: it lives out its timeout; create it with leased=true to hold it", roche.ErrInvalidConfig, tg.ID)
	}
	return err
}

// dropShared lets go of this replica's lease of a group's sandbox nobody holds here.
func (l *Ledger) dropShared(id, provider string) {
	if p, ok := l.providers[provider].(kit.LeaseHolder); ok {
		p.DropLease(id)
		l.log.Debug("no Hold of the group's sandbox here: let go of its lease", "id", id)
	}
}

// keyed is a create's idempotency key, kept for retries to this replica: the sandbox it
// made, or the create in flight.
type keyed struct {
	done chan struct{}
	sb   roche.SandboxInfo
	err  error
	at   time.Time
}

// keyedRetention is how long a replica remembers a key it served.
const keyedRetention = 10 * time.Minute

// byKey serves a create with an idempotency key once per tenant and key: a second one
// while the first runs waits for it, one after gets its sandbox if it still lives;
// create makes the sandbox.
func (l *Ledger) byKey(t *Tenant, key string, create func() (roche.SandboxInfo, bool, error)) (roche.SandboxInfo, bool, error) {
	k := t.Name + "\x00" + key
	l.keysMu.Lock()
	now := time.Now()
	for old, e := range l.keys {
		if isDone(e.done) && now.Sub(e.at) > keyedRetention {
			delete(l.keys, old)
		}
	}
	e, ok := l.keys[k]
	if ok && isDone(e.done) && e.err != nil {
		ok = false // a failed create is no answer: make it again
	}
	if !ok {
		e = &keyed{done: make(chan struct{})}
		l.keys[k] = e
		l.keysMu.Unlock()
		e.sb, _, e.err = create()
		e.at = time.Now()
		close(e.done)
		return e.sb, false, e.err
	}
	l.keysMu.Unlock()
	<-e.done
	if e.err != nil {
		return roche.SandboxInfo{}, false, e.err
	}
	if _, live := l.Tracked(e.sb.ID); !live {
		return roche.SandboxInfo{}, false, fmt.Errorf("%w: sandbox %s, made by an earlier create with this idempotency key, was destroyed: create with another key", roche.ErrNotFound, e.sb.ID)
	}
	return e.sb, false, nil
}

func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
