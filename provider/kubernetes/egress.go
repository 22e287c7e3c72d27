package kubernetes

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
)

// WithEgressProxy lets sandboxes have a network_allowlist. Their Pods keep no network
// (only loopback, and a deny-all NetworkPolicy); programs use the agent's proxy port
// (egress.SandboxListen), the agent relays each connection to the relay's egress
// socket, and the relay carries it up the sandbox's relay session to the egress proxy
// this process runs, which alone decides. So this process must outlive the sandboxes:
// roched does, and so does `roche run`; a short-lived `roche create` does not, and must
// leave this off.
//
// A sandbox with an https:// entry or a secret has a CA of its own, made by this
// process, its key only in this process's memory: its certificate reaches the Pod in a
// ConfigMap of the sandbox's name (trustConfigMap), bound read-only over the trust
// paths (egress.SandboxBundle, egress.SandboxCACert); the secrets' placeholders are in
// its container's environment, their values only in the proxy.
func WithEgressProxy() Option { return func(p *Provider) { p.egress = true } }

// Keys of a sandbox's trust ConfigMap.
const (
	trustBundleKey = "ca-certificates.crt"
	trustCAKey     = "roche-egress.crt"
	volumeTrust    = "roche-egress-ca"
)

// newEgressProxy makes the egress proxy of sandbox id, with its CA when cfg needs one
// and each secret's placeholder from placeholders (a proxy made again keeps them) or a
// new one. It returns what the Pod must get.
func (p *Provider) newEgressProxy(id string, cfg roche.Config, placeholders map[string]string) (*egress.Proxy, egress.TrustPEM, error) {
	pol, err := egress.ParsePolicy(cfg.NetworkAllowlist)
	if err != nil {
		return nil, egress.TrustPEM{}, fmt.Errorf("%w: sandbox %s: %v", roche.ErrInvalidConfig, id, err)
	}
	opts := egress.Options{Policy: pol, Sandbox: id, Log: p.log.With("egress", id)}
	trust, err := egress.MakeTrust(&opts, id, egresswire.SecretSpecs(cfg.Secrets), placeholders)
	if err != nil {
		return nil, egress.TrustPEM{}, fmt.Errorf("%w: sandbox %s: %v", roche.ErrInvalidConfig, id, err)
	}
	return egress.New(opts), trust, nil
}

// egressProxy returns the egress proxy of sandbox id when it has an allowlist and this
// process serves them, else nil. The create made it; one this process did not make (it
// restarted, or another replica made the sandbox) is made on first use, with the
// placeholders the Pod holds and a new CA, which the Pod does not trust (its ConfigMap,
// bound by subPath, is never updated in it): intercepted hosts then fail certificate
// verification inside, the safe failure, and the secrets' values are gone. It is kept
// across relay sessions (a broken exec stream, a restart's new session), so that its caps
// count the sandbox's whole life. p.sessMu is held.
func (p *Provider) egressProxy(ctx context.Context, id string) (*egress.Proxy, error) {
	if !p.egress {
		return nil, nil
	}
	if px := p.proxies[id]; px != nil {
		return px, nil
	}
	p.mu.Lock()
	s, known := p.verified[id]
	p.mu.Unlock()
	cfg := s.cfg
	var pod *corev1.Pod
	if !known || len(cfg.Secrets) > 0 {
		var err error
		if pod, err = p.get(ctx, id); err != nil {
			return nil, err
		}
		if !known {
			cfg = configOf(pod)
		}
	}
	if len(cfg.NetworkAllowlist) == 0 {
		return nil, nil
	}
	placeholders := map[string]string{}
	if pod != nil {
		for _, c := range pod.Spec.Containers {
			if c.Name != containerSandbox {
				continue
			}
			for _, e := range c.Env {
				for _, sec := range cfg.Secrets {
					if e.Name == sec.Name {
						placeholders[e.Name] = e.Value
					}
				}
			}
		}
	}
	px, _, err := p.newEgressProxy(id, cfg.Config, placeholders)
	if err != nil {
		return nil, err
	}
	p.proxies[id] = px
	return px, nil
}

// keepEgress makes px the egress proxy of sandbox id, unless it has one already (a keyed
// create joining an earlier one's sandbox): px is then closed, and false returned.
func (p *Provider) keepEgress(id string, px *egress.Proxy) bool {
	p.sessMu.Lock()
	defer p.sessMu.Unlock()
	if p.proxies[id] != nil {
		px.Close()
		return false
	}
	p.proxies[id] = px
	return true
}

// stopEgress closes the egress proxy of sandbox id, if this process runs one.
func (p *Provider) stopEgress(id string) {
	p.sessMu.Lock()
	px := p.proxies[id]
	delete(p.proxies, id)
	p.sessMu.Unlock()
	if px != nil {
		px.Close()
	}
}

// stopAllEgress closes every egress proxy (Close).
func (p *Provider) stopAllEgress() {
	p.sessMu.Lock()
	all := p.proxies
	p.proxies = map[string]*egress.Proxy{}
	p.sessMu.Unlock()
	for _, px := range all {
		px.Close()
	}
}

// trustConfigMap holds the certificate of sandbox id's CA for its Pod: the trust store
// (the roots of the host running the proxy, and the CA) and the CA alone. No key.
func trustConfigMap(id, namespace string, t egress.TrustPEM) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: id, Namespace: namespace,
			Labels: map[string]string{LabelManaged: "true", LabelProvider: Name, LabelSandbox: id},
		},
		Data:      map[string]string{trustBundleKey: string(t.Bundle), trustCAKey: string(t.CACert)},
		Immutable: ptr(true),
	}
}

// trustVolume binds sandbox id's trust ConfigMap read-only over the trust paths of the
// sandbox's container.
func trustVolume(pod *corev1.Pod, id string) {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: volumeTrust, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: id}, DefaultMode: ptr(int32(0o444))},
	}})
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name != containerSandbox {
			continue
		}
		c.VolumeMounts = append(c.VolumeMounts,
			corev1.VolumeMount{Name: volumeTrust, MountPath: egress.SandboxBundle, SubPath: trustBundleKey, ReadOnly: true},
			corev1.VolumeMount{Name: volumeTrust, MountPath: egress.SandboxCACert, SubPath: trustCAKey, ReadOnly: true})
	}
}

// sweepTrust deletes the trust ConfigMaps of sandboxes whose Pod is gone (a create cut
// short between the two; the owner reference covers the rest).
func (p *Provider) sweepTrust(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	sel := labels.SelectorFromSet(labels.Set{LabelManaged: "true", LabelProvider: Name}).String()
	cms, err := p.cs.CoreV1().ConfigMaps(p.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return p.apiErr("listing the sandboxes' ConfigMaps", err)
	}
	for _, cm := range cms.Items {
		if time.Since(cm.CreationTimestamp.Time) < 2*p.createTimeout {
			continue // its create may still be under way
		}
		if _, err := p.cs.CoreV1().Pods(p.namespace).Get(ctx, cm.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			_ = p.cs.CoreV1().ConfigMaps(p.namespace).Delete(ctx, cm.Name, metav1.DeleteOptions{})
		}
	}
	return nil
}
