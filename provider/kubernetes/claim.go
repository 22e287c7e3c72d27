package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var (
	_ kit.Claimer = (*Provider)(nil)
	_ kit.Prober  = (*Provider)(nil)
)

// Claim implements kit.Claimer: one merge patch of the Pod gives it its new owner
// (AnnotationOwner, and in the config it carries), its new end (LabelExpires), the
// holder's env and workdir (AnnotationClaim) and an activeDeadlineSeconds that ends it
// then, so that the labels alone say whose it is and until when (a roched restarted
// without its state adopts it from them; gc reaps it at its own end, not the pool's). The
// kubelet counts the deadline from the Pod's start and lets it only shrink, which a
// claim always does: a client's lifetime is within what the pool gave the sandbox.
func (p *Provider) Claim(ctx context.Context, id string, c kit.Claim) error {
	owner, expires := c.Owner, c.Expires
	if p.noCluster != nil {
		return p.noCluster
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	p.mu.Lock()
	s, known := p.verified[id]
	p.mu.Unlock()
	if !known || s.started.IsZero() {
		pod, err := p.get(ctx, id)
		if err != nil {
			return err
		}
		s = sandbox{id: id, expires: expiresOf(pod.Labels), cfg: configOf(pod), started: startOf(pod), agent: p.agentClient(id)}
		if s.started.IsZero() {
			return fmt.Errorf("%w: sandbox %s has not started (its Pod is %s)", roche.ErrNotFound, id, pod.Status.Phase)
		}
	}
	if expires.After(s.expires) {
		return fmt.Errorf("%w: sandbox %s ends at %s: it cannot be claimed until %s", roche.ErrInvalidConfig, id, s.expires.Format(time.RFC3339), expires.Format(time.RFC3339))
	}
	deadline := int64(math.Ceil(expires.Sub(s.started).Seconds()))
	deadline = max(deadline, 1)
	if s.cfg.TimeoutSecs > 0 {
		deadline = min(deadline, int64(s.cfg.TimeoutSecs))
	}
	// The config it carries becomes the holder's too, so that whoever reads it (Reset)
	// makes the sandbox its holder's, not the pool's.
	cfg := s.cfg
	cfg.Owner = owner
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	held, err := json.Marshal(claimed{Env: c.Env, Workdir: c.Workdir})
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"labels":        map[string]string{LabelExpires: strconv.FormatInt(expires.Unix(), 10)},
			"annotations":   map[string]string{AnnotationOwner: owner, AnnotationConfig: string(cfgJSON), AnnotationClaim: string(held)},
			"managedFields": noManagedFields,
		},
		"spec": map[string]any{"activeDeadlineSeconds": deadline},
	})
	if err != nil {
		return err
	}
	if _, err := p.cs.CoreV1().Pods(p.namespace).Patch(ctx, id, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return p.apiErr("claiming sandbox "+id, err)
	}
	s.expires, s.cfg = expires, cfg
	p.remember(s)
	return nil
}

// noManagedFields, as a patch's metadata.managedFields, drops the Pod's field ownership
// records (managedFields: a list of one empty entry clears them), and the API server
// keeps none for the Pod's later writes: it tracks ownership only on an object that has
// some, or on a create. Roche's Pods are written by roched alone (their status by the
// kubelet), and nothing reads who set which field, while keeping the records took a
// quarter of the API server's CPU in a claim's PATCH (structured-merge-diff walking the
// whole Pod and each manager's fields: perf of the API server during bench/k8sscale),
// more in its garbage collection, and 3.5 of a claimed Pod's 8.1 KB, which every watcher
// of Pods is sent on each change.
var noManagedFields = []map[string]any{{}}

// claimed is AnnotationClaim: what a claim adds to what the labels say.
type claimed struct {
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
}

// Claimed implements kit.Claimer, from the Pod's annotations and labels.
func (p *Provider) Claimed(ctx context.Context, id string) (kit.Claim, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	pod, err := p.get(ctx, id)
	if err != nil {
		return kit.Claim{}, false, err
	}
	raw, ok := pod.Annotations[AnnotationClaim]
	if !ok {
		return kit.Claim{}, false, nil
	}
	var h claimed
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		return kit.Claim{}, false, fmt.Errorf("sandbox %s: its claim annotation: %w", id, err)
	}
	return kit.Claim{Owner: pod.Annotations[AnnotationOwner], Expires: expiresOf(pod.Labels), Env: h.Env, Workdir: h.Workdir}, true, nil
}

// Probe implements kit.Prober: the sandbox's agent answers through its relay session,
// which a sandbox this provider made or reached keeps open, so no API request is made.
// A Pod that died took its session with it, and the probe fails.
func (p *Provider) Probe(ctx context.Context, id string) error {
	if p.sim != nil {
		return p.probeSimulated(ctx, id)
	}
	t, err := p.reach(ctx, id)
	if err != nil {
		return err
	}
	if _, err := t.Agent.Health(ctx); err != nil {
		return fmt.Errorf("%w: the agent of sandbox %s does not answer: %s", roche.ErrUnavailable, id, oneLine(err.Error()))
	}
	return nil
}

var _ roche.LifetimeSetter = (*Provider)(nil)

// SetTimeout implements roche.LifetimeSetter: the agent, whose timer ends the sandbox, is
// told the new end, then one merge patch gives the Pod its new end (LabelExpires) and an
// activeDeadlineSeconds that ends it then. The kubelet lets a Pod's deadline only shrink,
// so a sandbox can be given less time, or more up to the end its Pod was made with, and no
// later: that is refused, saying when.
func (p *Provider) SetTimeout(ctx context.Context, id string, d time.Duration) (roche.SandboxInfo, error) {
	if err := roche.ValidTimeout(d); err != nil {
		return roche.SandboxInfo{}, err
	}
	if p.noCluster != nil {
		return roche.SandboxInfo{}, p.noCluster
	}
	end := time.Now().Add(d)
	cctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	pod, err := p.get(cctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	started := startOf(pod)
	if started.IsZero() {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s has not started (its Pod is %s)", roche.ErrNotFound, id, pod.Status.Phase)
	}
	deadline := max(int64(math.Ceil(end.Sub(started).Seconds())), 1)
	if cur := pod.Spec.ActiveDeadlineSeconds; cur != nil && deadline > *cur {
		last := started.Add(time.Duration(*cur) * time.Second)
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s can live until %s at most: a Pod's activeDeadlineSeconds can only shrink, so kubernetes sandboxes cannot be given more than the lifetime they were made with; create it with a longer timeout",
			roche.ErrUnsupported, id, last.Format(time.RFC3339))
	}
	if err := p.forwarder.SetLifetime(ctx, id, d); err != nil {
		return roche.SandboxInfo{}, err
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"labels": map[string]string{LabelExpires: strconv.FormatInt(end.Unix(), 10)}, "managedFields": noManagedFields},
		"spec":     map[string]any{"activeDeadlineSeconds": deadline},
	})
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	if _, err := p.cs.CoreV1().Pods(p.namespace).Patch(cctx, id, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return roche.SandboxInfo{}, p.apiErr("setting the lifetime of sandbox "+id, err)
	}
	p.mu.Lock()
	if s, ok := p.verified[id]; ok {
		s.expires = time.Unix(end.Unix(), 0)
		p.verified[id] = s
	}
	p.mu.Unlock()
	return p.Inspect(ctx, id)
}
