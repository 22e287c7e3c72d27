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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
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
	if errors.Is(err, roche.ErrNotFound) {
		return roche.SandboxInfo{}, errKeyedGone
	}
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	if pod.Annotations[AnnotationOwner] != cfg.Owner {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s of this idempotency key is another owner's: create with another key",
			roche.ErrInvalidConfig, id)
	}
	if pod.DeletionTimestamp != nil {
		return roche.SandboxInfo{}, errKeyedGone
	}
	if phase := pod.Status.Phase; phase == corev1.PodSucceeded || phase == corev1.PodFailed {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s, made by an earlier create with this idempotency key, has stopped: create with another key",
			roche.ErrNotFound, id)
	}
	running, err := p.waitRunning(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, p.keyedGone(ctx, id, err)
	}
	sb := sandbox{id: id, expires: expiresOf(running.Labels), cfg: cfg, agent: p.agentClient(id), started: startOf(running)}
	if p.sim == nil {
		if err := p.waitAgent(ctx, sb); err != nil {
			return roche.SandboxInfo{}, p.keyedGone(ctx, id, err)
		}
	}
	// The earlier create may still fail and remove what it made (its replica
	// stopping, as the client's retry suggests): a Pod gone or going by now is
	// errKeyedGone, not "no sandbox", so the retry makes the sandbox afresh.
	if cfg.Leased {
		if err := p.HoldLease(ctx, id); err != nil {
			return roche.SandboxInfo{}, p.keyedGone(ctx, id, err)
		}
	}
	if err := p.keyedGone(ctx, id, nil); err != nil {
		if cfg.Leased {
			p.leases.Drop(id)
		}
		return roche.SandboxInfo{}, err
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
	if err := p.leases.Take(ctx, id, p.agentClient(id)); err != nil {
		return p.leaseErr(ctx, id, err)
	}
	return nil
}

// leaseErr says why the lease of sandbox id could not be taken, in the terms a client
// acts on: the agent's own answer, or, when the agent did not answer (its connection
// broke, or the relay could not reach it), what the sandbox's Pod says: the sandbox is
// going, which no retry changes, or the way to it failed, which a retry of the Hold,
// through this replica or another, may not meet again.
func (p *Provider) leaseErr(ctx context.Context, id string, err error) error {
	var ge *guest.Error
	switch {
	case errors.As(err, &ge) && ge.Code == guest.CodeUnsupported:
		return fmt.Errorf("%w: sandbox %s is not leased (%s): it lives out its lifetime", roche.ErrUnsupported, id, ge.Message)
	case errors.As(err, &ge) && ge.Code == guest.CodeNotFound:
		return fmt.Errorf("%w: sandbox %s lost its lease and is stopping", roche.ErrNotFound, id)
	case errors.As(err, &ge):
		return err
	}
	if pod, gerr := p.get(ctx, id); errors.Is(gerr, roche.ErrNotFound) || gerr == nil && podEnded(pod) {
		return fmt.Errorf("%w: sandbox %s is gone or stopping (%v)", roche.ErrNotFound, id, err)
	}
	return fmt.Errorf("%w: %w", roche.ErrUnavailable, err)
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

// errKeyedGone says the Pod of an idempotency key is gone or going: the create that made
// it failed, its maker removing it, or it was destroyed. A retried create then makes the
// sandbox again once what the earlier one made is gone.
var errKeyedGone = errors.New("the sandbox of this idempotency key is gone or going")

// keyedGone is errKeyedGone when the keyed Pod a join waited for went meanwhile, else err.
func (p *Provider) keyedGone(ctx context.Context, id string, err error) error {
	pod, gerr := p.get(ctx, id)
	if errors.Is(gerr, roche.ErrNotFound) || gerr == nil && pod.DeletionTimestamp != nil {
		return errKeyedGone
	}
	return err
}

// awaitRemoved waits until the Pod of sandbox id, its NetworkPolicy and its egress
// ConfigMap are all gone: an earlier create of the same key removing them has then
// finished, and cannot delete what a new create makes under the same names. Its maker
// deletes all three at once, and the Pod goes last (once the kubelet has stopped it):
// the Pod is watched until it is gone. The policy and the ConfigMap, which the Role lets
// this provider list but not watch, are listed then, and again after a growing pause
// while the garbage collector removes those a maker killed midway left (tied to the
// Pod). It gives up when ctx ends.
func (p *Provider) awaitRemoved(ctx context.Context, id string) error {
	p.log.Debug("waiting for the earlier create of this idempotency key to remove its sandbox", "id", id)
	stillThere := func() error {
		return fmt.Errorf("%w: sandbox %s of this idempotency key, made by an earlier create that failed, is still being removed: create again",
			roche.ErrUnavailable, id)
	}
	if !p.awaitPodGone(ctx, id) {
		return stillThere()
	}
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		policy, nerr := p.policyExists(ctx, id)
		cms, cerr := p.cs.CoreV1().ConfigMaps(p.namespace).List(ctx, byName(id))
		if nerr == nil && !policy && cerr == nil && !namedIn(id, cms.Items) {
			return nil
		}
		if !sleepCtx(ctx, pause) {
			return stillThere()
		}
	}
}

// awaitPodGone waits on a watch, from the resourceVersion of a list that still had it,
// until the Pod of sandbox id is gone, and reports whether it is (false: ctx ended). A
// watch cut off, or refused, is made again from a new list.
func (p *Provider) awaitPodGone(ctx context.Context, id string) bool {
	for retry := 100 * time.Millisecond; ; retry = min(2*retry, watchRetry) {
		pods, err := p.cs.CoreV1().Pods(p.namespace).List(ctx, byName(id))
		if err == nil && !namedIn(id, pods.Items) {
			return true
		}
		if err == nil {
			var w watch.Interface
			w, err = p.cs.CoreV1().Pods(p.namespace).Watch(ctx, metav1.ListOptions{
				FieldSelector: byName(id).FieldSelector, ResourceVersion: pods.ResourceVersion,
			})
			if err == nil && podDeleted(ctx, w, id) {
				return true
			}
		}
		if err != nil {
			p.log.Debug("watching the Pod of an earlier create of this idempotency key", "id", id, "err", err)
		}
		if !sleepCtx(ctx, retry) {
			return false
		}
	}
}

// podDeleted reports whether w tells of the deletion of Pod name before it ends or ctx
// does; it stops w.
func podDeleted(ctx context.Context, w watch.Interface, name string) bool {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case e, ok := <-w.ResultChan():
			if !ok || e.Type == watch.Error {
				return false
			}
			if pod, isPod := e.Object.(*corev1.Pod); isPod && e.Type == watch.Deleted && pod.Name == name {
				return true
			}
		}
	}
}

// ensurePolicy makes sure the deny-all NetworkPolicy of a keyed sandbox still stands
// once its Pod runs, before the sandbox is handed out: the policy this create found
// already there may have been an earlier, failed create's, which its maker then
// deleted by name. A policy gone is made again, tied to the Pod.
func (p *Provider) ensurePolicy(ctx context.Context, id string, podUID types.UID) error {
	exists, err := p.policyExists(ctx, id)
	if err != nil {
		return p.apiErr("checking the NetworkPolicy of sandbox "+id, err)
	}
	if exists {
		return nil
	}
	np := networkPolicyFor(id, p.namespace)
	np.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: id, UID: podUID}}
	if _, err := p.cs.NetworkingV1().NetworkPolicies(p.namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return p.apiErr("making the deny-all NetworkPolicy of sandbox "+id+" again", err)
	}
	p.log.Warn("the deny-all NetworkPolicy of a keyed sandbox had gone with an earlier create of its key: made again", "id", id)
	return nil
}

// policyExists says whether sandbox id's NetworkPolicy stands. It lists by name (the Role
// grants list, not get, on policies and ConfigMaps: deploy/kubernetes/role.yaml).
func (p *Provider) policyExists(ctx context.Context, id string) (bool, error) {
	l, err := p.cs.NetworkingV1().NetworkPolicies(p.namespace).List(ctx, byName(id))
	if err != nil {
		return false, err
	}
	return namedIn(id, l.Items), nil
}

func byName(name string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
}

// namedIn says whether one of items is named name (a list's field selector is not
// trusted alone: not every client applies it).
func namedIn[T any, PT interface {
	*T
	GetName() string
}](name string, items []T) bool {
	for i := range items {
		if PT(&items[i]).GetName() == name {
			return true
		}
	}
	return false
}
