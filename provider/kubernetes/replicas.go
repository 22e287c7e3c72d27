package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
)

// What roched replicas (--replica-group) need of the provider: a sandbox's name that a
// retried create finds again (an idempotency key), a lease a replica can take over
// from another, and a leader among them. Everything else they share is on the Pods
// already: owner (roche.owner), end (roche.expires, activeDeadlineSeconds), tenant (in
// the owner), and the lease, held by the agent in the Pod for whoever holds it.

var (
	_ kit.LeaseHolder = (*Provider)(nil)
	_ kit.Elector     = (*Provider)(nil)
)

// WithLeaseGrace sets how long a leased sandbox outlives its last lease holder
// (default agentspec.LeaseGrace, 3 s). roched replicas lengthen it, so that a client's
// Hold has time to move from a replica that died to another.
func WithLeaseGrace(d time.Duration) Option {
	return func(p *Provider) {
		if d < 0 {
			p.badOption = errors.Join(p.badOption, fmt.Errorf("%w: lease grace %s is negative", roche.ErrInvalidConfig, d))
		}
		p.leaseGrace = d
	}
}

// keyedName is the Pod name of a create with an idempotency key: the same for every
// process creating for the same owner with the same key, so that the API server, which
// keeps names unique, makes one Pod of two creates.
func keyedName(owner, key string) string {
	sum := sha256.Sum256([]byte("roche-idempotency\x00" + owner + "\x00" + key))
	return Name + "-" + hex.EncodeToString(sum[:8])
}

// joinKeyed answers a create whose Pod an earlier create with the same owner and key
// made: it waits for that Pod as a create waits for its own and answers with it. It
// never removes it: it is the earlier create's.
func (p *Provider) joinKeyed(ctx context.Context, id string, cfg kit.Spec) (roche.SandboxInfo, error) {
	pod, err := p.get(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	if pod.Annotations[AnnotationOwner] != cfg.Owner || pod.DeletionTimestamp != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s of this idempotency key is being destroyed or is another owner's: create with another key",
			roche.ErrInvalidConfig, id)
	}
	if phase := pod.Status.Phase; phase == corev1.PodSucceeded || phase == corev1.PodFailed {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s, made by an earlier create with this idempotency key, has stopped: create with another key",
			roche.ErrNotFound, id)
	}
	running, err := p.waitRunning(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	sb := sandbox{id: id, expires: expiresOf(running.Labels), cfg: cfg, agent: p.agentClient(id), started: startOf(running)}
	if p.sim == nil {
		if err := p.waitAgent(ctx, sb); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	if cfg.Leased {
		if err := p.HoldLease(ctx, id); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	p.log.Debug("create answered with the sandbox of its idempotency key", "id", id)
	return p.info(running), nil
}

// HoldLease implements kit.LeaseHolder: this process holds the agent's lease too, by an
// open connection, as a create that made it leased does.
func (p *Provider) HoldLease(ctx context.Context, id string) error {
	if _, err := p.get(ctx, id); err != nil {
		return err
	}
	err := p.leases.Take(ctx, id, p.agentClient(id))
	var ge *guest.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ge) && ge.Code == guest.CodeUnsupported:
		return fmt.Errorf("%w: sandbox %s is not leased (%s): it lives out its lifetime", roche.ErrUnsupported, id, ge.Message)
	case errors.As(err, &ge) && ge.Code == guest.CodeNotFound:
		return fmt.Errorf("%w: sandbox %s lost its lease and is stopping", roche.ErrNotFound, id)
	}
	return err
}

// DropLease implements kit.LeaseHolder.
func (p *Provider) DropLease(id string) { p.leases.Drop(id) }

// DefaultLeaderLease is how long a leader's Lease object lasts unrenewed: a leader killed
// outright is replaced within it.
const DefaultLeaderLease = 15 * time.Second

// Elect implements kit.Elector with client-go's leader election over a
// coordination.k8s.io Lease named roched-GROUP in the provider's namespace. The leader
// renews it every third of lease; one that cannot renew within two thirds stops leading,
// and a stopped ctx gives the Lease up at once.
func (p *Provider) Elect(ctx context.Context, group, identity string, lease time.Duration) (func() bool, error) {
	if p.noCluster != nil {
		return nil, p.noCluster
	}
	if lease <= 0 {
		lease = DefaultLeaderLease
	}
	if lease < 3*time.Second {
		return nil, fmt.Errorf("%w: leader lease %s is under 3s", roche.ErrInvalidConfig, lease)
	}
	if err := p.ensureNamespace(ctx); err != nil {
		return nil, err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: "roched-" + group, Namespace: p.namespace},
		Client:     p.cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	var leading atomic.Bool
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   lease,
		RenewDeadline:   lease * 2 / 3,
		RetryPeriod:     lease / 6,
		ReleaseOnCancel: true,
		Name:            "roched-" + group,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				leading.Store(true)
				p.log.Info("leading the replica group: reaping and reconciling its sandboxes", "group", group, "identity", identity)
			},
			OnStoppedLeading: func() {
				leading.Store(false)
				p.log.Info("no longer leading the replica group", "group", group, "identity", identity)
			},
			OnNewLeader: func(id string) {
				if id != identity {
					p.log.Info("the replica group's leader", "group", group, "leader", id)
				}
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: leader election: %v", roche.ErrInvalidConfig, err)
	}
	go func() {
		// Run returns when it stops leading or ctx ends; campaign again until ctx ends.
		for ctx.Err() == nil {
			le.Run(ctx)
		}
	}()
	return leading.Load, nil
}
