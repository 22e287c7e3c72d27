package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/provider/internal/uidrange"
	"github.com/roche-sandbox/roche/provider/kit"
)

// A workspace is a PersistentVolumeClaim in the sandboxes' namespace, named
// roche-ws-<16 hex of the SHA-256 of its name> (a workspace's name may hold what an
// object's name cannot: capitals, '_'), made by the first create that names it, from the
// StorageClass WithStorageClass gives (else the cluster's default), of the workspace's
// size. It is mounted read-write at /workspace in each sandbox that names it, handed to
// the workspace's own uid by the agent, and kept when a sandbox is destroyed or reset:
// RemoveWorkspace deletes it, and the class's reclaim policy (Delete, as a rule) then
// has its provisioner delete the volume.
const (
	// LabelWorkspace, on a workspace's claim, is its name when a label can hold it (63
	// characters, ending with a letter or digit); AnnotationWorkspace always holds it.
	LabelWorkspace      = "roche.workspace"
	AnnotationWorkspace = "roche.workspace"
	// LabelTenant, on a workspace's claim, is the roched tenant whose workspace it is
	// (the part of the name before "--", as roched names a tenant's workspaces).
	LabelTenant = "roche.tenant"

	claimPrefix     = "roche-ws-"
	volumeWorkspace = "workspace"
)

var (
	_ roche.WorkspaceManager = (*Provider)(nil)
)

// WithStorageClass makes workspaces' PersistentVolumeClaims of this StorageClass (roche
// and roched --kube-storage-class); by default, the cluster's default class. It matters
// only when a workspace is made: one that exists keeps its class.
func WithStorageClass(name string) Option { return func(p *Provider) { p.storageClass = name } }

// claimName is the PersistentVolumeClaim of workspace name.
func claimName(name string) string {
	sum := sha256.Sum256([]byte(name))
	return claimPrefix + hex.EncodeToString(sum[:8])
}

// workspaceOf returns the workspace name a claim of this provider's holds, or "".
func workspaceOf(pvc *corev1.PersistentVolumeClaim) string {
	if pvc.Labels[LabelManaged] != "true" || pvc.Labels[LabelProvider] != Name {
		return ""
	}
	name := pvc.Annotations[AnnotationWorkspace]
	if !roche.ValidWorkspaceName(name) || claimName(name) != pvc.Name {
		return ""
	}
	return name
}

// claimSize is what a claim asks for, in bytes.
func claimSize(pvc *corev1.PersistentVolumeClaim) int64 {
	q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	return q.Value()
}

// workspaceUID is the uid recorded on a workspace's claim (LabelUID), -1 when none.
func workspaceUID(pvc *corev1.PersistentVolumeClaim) int {
	uid, err := strconv.Atoi(pvc.Labels[LabelUID])
	if err != nil || uid < 0 {
		return -1
	}
	return uid
}

// drawWorkspaceUID picks a uid from the second half of the range: a sandbox's drawn uid
// (the first half) never meets one.
func (p *Provider) drawWorkspaceUID() int {
	half := p.uidCount / 2
	return uidrange.Draw(p.uidFirst+half, p.uidCount-half)
}

// workspaceClaimFor is the claim a new workspace is made as.
func (p *Provider) workspaceClaimFor(name string, bytes int64, uid int) *corev1.PersistentVolumeClaim {
	lbl := map[string]string{LabelManaged: "true", LabelProvider: Name, LabelUID: strconv.Itoa(uid)}
	if len(validation.IsValidLabelValue(name)) == 0 {
		lbl[LabelWorkspace] = name
	}
	if tenant, _, ok := strings.Cut(name, "--"); ok && len(validation.IsValidLabelValue(tenant)) == 0 {
		lbl[LabelTenant] = tenant
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: claimName(name), Namespace: p.namespace, Labels: lbl,
			Annotations: map[string]string{AnnotationWorkspace: name},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: *resource.NewQuantity(bytes, resource.BinarySI),
			}},
		},
	}
	if p.storageClass != "" {
		pvc.Spec.StorageClassName = ptr(p.storageClass)
	}
	return pvc
}

// ensureWorkspace returns workspace name's claim, made when missing (want bytes, else
// the default size), with the uid its sandboxes run as; made says this call made it. A
// size asked for must be the one it has.
func (p *Provider) ensureWorkspace(ctx context.Context, name string, want int64) (pvc *corev1.PersistentVolumeClaim, made bool, err error) {
	claims := p.cs.CoreV1().PersistentVolumeClaims(p.namespace)
	pvc, err = claims.Get(ctx, claimName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if pvc, made, err = p.makeWorkspace(ctx, name, want); err != nil || made {
			return pvc, made, err
		}
	} else if err != nil {
		return nil, false, p.apiErr("reading workspace "+name, err)
	}
	switch {
	case workspaceOf(pvc) != name:
		return nil, false, fmt.Errorf("%w: workspace %s: the PersistentVolumeClaim %s in namespace %s is not one Roche made for it: remove it or use another name",
			roche.ErrInvalidConfig, name, pvc.Name, p.namespace)
	case pvc.DeletionTimestamp != nil:
		return nil, false, fmt.Errorf("%w: workspace %s is being removed: try again once it is gone", roche.ErrInUse, name)
	case want != 0 && want != claimSize(pvc):
		return nil, false, fmt.Errorf("%w: workspace %s has a size of %s, fixed when it was made, and %s was asked for: leave the size out to use it as it is, or remove it (roche workspace rm %s) and make it again with the new size",
			roche.ErrInvalidConfig, name, size.String(claimSize(pvc)), size.String(want), name)
	case workspaceUID(pvc) < 0:
		return nil, false, fmt.Errorf("%w: workspace %s: its PersistentVolumeClaim %s carries no %s label: remove it (roche workspace rm %s)",
			roche.ErrInvalidConfig, name, pvc.Name, LabelUID, name)
	}
	return pvc, false, nil
}

// makeWorkspace makes workspace name's claim with a uid no other workspace of the
// namespace has; made is false when another create made it first (then pvc is nil and
// the caller reads that one).
func (p *Provider) makeWorkspace(ctx context.Context, name string, want int64) (pvc *corev1.PersistentVolumeClaim, made bool, err error) {
	if want == 0 {
		want = kit.DefaultWorkspaceBytes
	}
	uid, err := p.freeWorkspaceUID(ctx, "")
	if err != nil {
		return nil, false, err
	}
	claims := p.cs.CoreV1().PersistentVolumeClaims(p.namespace)
	pvc, err = claims.Create(ctx, p.workspaceClaimFor(name, want, uid), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		pvc, err = claims.Get(ctx, claimName(name), metav1.GetOptions{})
		return pvc, false, p.apiErr("reading workspace "+name, err)
	}
	if err != nil {
		return nil, false, p.apiErr("making the PersistentVolumeClaim of workspace "+name, err)
	}
	// Left without a class, the claim found no default StorageClass to take (the API
	// server's DefaultStorageClass admission gives it one when the cluster has one), and
	// no volume would ever be made for it.
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName == "" {
		p.deleteClaim(ctx, pvc.Name)
		return nil, false, fmt.Errorf("%w: workspace %s: the cluster has no default StorageClass to make its PersistentVolumeClaim from: pass --kube-storage-class NAME (kubernetes.WithStorageClass; kubectl get storageclass lists the cluster's), or make one the default",
			roche.ErrUnavailable, name)
	}
	// Two workspaces made at once may have drawn the same uid: each labelled its claim
	// before looking, so at least one sees the other and draws again.
	for range maxUIDDraws {
		taken, err := p.workspaceUIDTaken(ctx, uid, pvc.Name)
		if err != nil || !taken {
			if err != nil {
				p.deleteClaim(ctx, pvc.Name)
			}
			return pvc, err == nil, err
		}
		if uid, err = p.freeWorkspaceUID(ctx, pvc.Name); err != nil {
			p.deleteClaim(ctx, pvc.Name)
			return nil, false, err
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, LabelUID, strconv.Itoa(uid))
		if pvc, err = claims.Patch(ctx, pvc.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			p.deleteClaim(ctx, claimName(name))
			return nil, false, p.apiErr("relabelling the PersistentVolumeClaim of workspace "+name, err)
		}
	}
	p.deleteClaim(ctx, pvc.Name)
	return nil, false, fmt.Errorf("%w: no free workspace uid after %d draws: widen the range (WithUIDRange)", roche.ErrExhausted, maxUIDDraws)
}

// maxUIDDraws bounds the draws of a workspace's uid.
const maxUIDDraws = 8

// freeWorkspaceUID draws a workspace uid no claim of the namespace but except carries.
func (p *Provider) freeWorkspaceUID(ctx context.Context, except string) (int, error) {
	for range maxUIDDraws {
		uid := p.drawWorkspaceUID()
		taken, err := p.workspaceUIDTaken(ctx, uid, except)
		if err != nil {
			return 0, err
		}
		if !taken {
			return uid, nil
		}
	}
	return 0, fmt.Errorf("%w: no free workspace uid after %d draws: widen the range (WithUIDRange)", roche.ErrExhausted, maxUIDDraws)
}

// workspaceUIDTaken reports whether a workspace claim other than except carries uid.
func (p *Provider) workspaceUIDTaken(ctx context.Context, uid int, except string) (bool, error) {
	list, err := p.cs.CoreV1().PersistentVolumeClaims(p.namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelManaged: "true", LabelProvider: Name, LabelUID: strconv.Itoa(uid),
	}).String()})
	if err != nil {
		return false, p.apiErr("listing the workspaces' uids", err)
	}
	for _, c := range list.Items {
		if c.Name != except {
			return true, nil
		}
	}
	return false, nil
}

// deleteClaim deletes a claim this provider made, for a create that failed.
func (p *Provider) deleteClaim(ctx context.Context, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
	defer cancel()
	if err := p.cs.CoreV1().PersistentVolumeClaims(p.namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		p.log.Warn("removing the PersistentVolumeClaim of a workspace made for a sandbox that could not be made", "claim", name, "err", err)
	}
}

// workspaceVolume mounts claim at /workspace in the sandbox's container.
func workspaceVolume(pod *corev1.Pod, claim string) {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: volumeWorkspace, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: volumeWorkspace, MountPath: roche.WorkspacePath})
}

// claimOf is the workspace claim a sandbox's Pod mounts, or "".
func claimOf(pod *corev1.Pod) string {
	for _, v := range pod.Spec.Volumes {
		if v.Name == volumeWorkspace && v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

// workspaceUsers maps claim names to the sandboxes whose Pods mount them. It reads the
// Pods' volumes, as the kubelet does.
func (p *Provider) workspaceUsers(ctx context.Context) (map[string][]string, error) {
	pods, err := p.cs.CoreV1().Pods(p.namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelManaged: "true", LabelProvider: Name,
	}).String()})
	if err != nil {
		return nil, p.apiErr("listing sandboxes", err)
	}
	users := map[string][]string{}
	for i := range pods.Items {
		if c := claimOf(&pods.Items[i]); c != "" {
			users[c] = append(users[c], pods.Items[i].Name)
		}
	}
	return users, nil
}

// Workspaces implements roche.WorkspaceManager: the claims of the namespace this
// provider made, but those being removed.
func (p *Provider) Workspaces(ctx context.Context) ([]roche.Workspace, error) {
	if p.noCluster != nil {
		return nil, p.noCluster
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	list, err := p.cs.CoreV1().PersistentVolumeClaims(p.namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelManaged: "true", LabelProvider: Name,
	}).String()})
	if err != nil {
		return nil, p.apiErr("listing workspaces", err)
	}
	users, err := p.workspaceUsers(ctx)
	if err != nil {
		return nil, err
	}
	out := []roche.Workspace{}
	for i := range list.Items {
		pvc := &list.Items[i]
		name := workspaceOf(pvc)
		if name == "" || pvc.DeletionTimestamp != nil {
			continue
		}
		out = append(out, roche.Workspace{Name: name, Provider: Name, CreatedAt: pvc.CreationTimestamp.Time,
			InUseBy: users[pvc.Name], SizeBytes: claimSize(pvc)})
	}
	slices.SortFunc(out, func(a, b roche.Workspace) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// RemoveWorkspace implements roche.WorkspaceManager: refused (ErrInUse) while a
// sandbox's Pod mounts the workspace, else its claim is deleted and waited for; the
// volume goes by its StorageClass's reclaim policy.
func (p *Provider) RemoveWorkspace(ctx context.Context, name string) error {
	if p.noCluster != nil {
		return p.noCluster
	}
	if !roche.ValidWorkspaceName(name) {
		return fmt.Errorf("%w: no workspace %q", roche.ErrNotFound, name)
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	claims := p.cs.CoreV1().PersistentVolumeClaims(p.namespace)
	pvc, err := claims.Get(ctx, claimName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err == nil && workspaceOf(pvc) != name {
		return fmt.Errorf("%w: no workspace %s (roche workspace list shows them)", roche.ErrNotFound, name)
	}
	if err != nil {
		return p.apiErr("reading workspace "+name, err)
	}
	users, err := p.workspaceUsers(ctx)
	if err != nil {
		return err
	}
	if ids := users[pvc.Name]; len(ids) > 0 {
		return fmt.Errorf("%w: workspace %s is mounted by sandbox %s: destroy it first (roche destroy %s)",
			roche.ErrInUse, name, strings.Join(ids, ", "), strings.Join(ids, " "))
	}
	// Preconditioned on the claim read: one made again meanwhile is not removed.
	err = claims.Delete(ctx, pvc.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pvc.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return p.apiErr("removing workspace "+name, err)
	}
	// The claim stays until no Pod uses it (its kubernetes.io/pvc-protection finalizer).
	for delay := 20 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		got, err := claims.Get(ctx, pvc.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && got.UID != pvc.UID {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: workspace %s is removed but its PersistentVolumeClaim %s is still held by a Pod being torn down: it goes once that Pod is gone",
				roche.ErrInUse, name, pvc.Name)
		case <-time.After(delay):
		}
	}
}

// wipeWorkspace empties workspace name for a reset that does not keep it: its claim is
// removed (once the reset sandbox's Pod has let go of it) and the config asks for a new
// one of the same size.
func (p *Provider) wipeWorkspace(ctx context.Context, cfg *kit.Spec) error {
	pvc, err := p.cs.CoreV1().PersistentVolumeClaims(p.namespace).Get(ctx, claimName(cfg.Workspace), metav1.GetOptions{})
	if err == nil && workspaceOf(pvc) == cfg.Workspace {
		cfg.WorkspaceSize = strconv.FormatInt(claimSize(pvc), 10)
	}
	for i := 0; ; i++ {
		err := p.RemoveWorkspace(ctx, cfg.Workspace)
		if errors.Is(err, roche.ErrNotFound) {
			return nil
		}
		if !errors.Is(err, roche.ErrInUse) || i == 10 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// claimFailures reads, while a Pod waits for its workspace's volume, the claim's
// ProvisioningFailed events (at most once a second): why no volume is made for it.
type claimFailures struct {
	last    time.Time
	message string
	off     bool // the events cannot be read
}

func (f *claimFailures) check(ctx context.Context, p *Provider, claim string) string {
	if f.off || time.Since(f.last) < time.Second {
		return f.message
	}
	f.last = time.Now()
	sel := fields.SelectorFromSet(fields.Set{
		"involvedObject.kind": "PersistentVolumeClaim", "involvedObject.name": claim, "reason": "ProvisioningFailed",
	}).String()
	evs, err := p.cs.CoreV1().Events(p.namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		f.off = apierrors.IsForbidden(err)
		return f.message
	}
	var latest time.Time
	for _, ev := range evs.Items {
		at := ev.LastTimestamp.Time
		if at.IsZero() {
			at = ev.EventTime.Time
		}
		if f.message == "" || !at.Before(latest) {
			latest, f.message = at, oneLine(ev.Message)
		}
	}
	return f.message
}
