package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/roche-sandbox/roche"
)

// DefaultSeccompProfile is the Localhost seccomp profile sandboxes run under: Roche's
// (SeccompProfile), which every node must hold in its kubelet's seccomp directory
// (SeccompInstallHint). A node without it fails the create with that hint; nothing runs
// under a weaker profile unless SeccompRuntimeDefault is asked for.
const DefaultSeccompProfile = "roche.json"

// SeccompRuntimeDefault, given to WithSeccompProfile (--seccomp-profile RuntimeDefault),
// runs sandboxes under the container runtime's own default profile instead of Roche's:
// weaker where the runtime allows io_uring and ptrace (containerd before 2.0 does), so it
// is had only by naming it.
const SeccompRuntimeDefault = "RuntimeDefault"

// SeccompInstallHint is the command that installs Roche's profile on a node.
const SeccompInstallHint = "roche kubernetes seccomp-profile --output /var/lib/kubelet/seccomp/" + DefaultSeccompProfile

// seccompMissing reports a container the runtime could not create because its node lacks
// the Localhost profile, with what to do; nil for any other reason.
func (p *Provider) seccompMissing(id, msg string) error {
	if p.seccomp == SeccompRuntimeDefault || !strings.Contains(msg, "seccomp") || !strings.Contains(msg, p.seccomp) {
		return nil
	}
	install := "install it on every node, in the kubelet's seccomp directory"
	if p.seccomp == DefaultSeccompProfile {
		install = "install Roche's on every node: " + SeccompInstallHint
	}
	return fmt.Errorf("%w: the Pod of sandbox %s cannot start: its node has no seccomp profile %s: %s (or pass --seccomp-profile %s for the runtime's own, weaker profile); the runtime said: %s",
		roche.ErrUnavailable, id, p.seccomp, install, SeccompRuntimeDefault, msg)
}

// runtimeClassRefused turns the API server's refusal of a Pod whose RuntimeClass it does
// not know (the RuntimeClass admission plugin's Forbidden) into what to do; nil for any
// other error.
func (p *Provider) runtimeClassRefused(err error) error {
	if p.runtimeClass == "" || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "RuntimeClass") {
		return nil
	}
	return fmt.Errorf("%w: runtime class %q: the cluster has no such RuntimeClass (kubectl get runtimeclasses lists those it has): %s",
		roche.ErrInvalidConfig, p.runtimeClass, oneLine(err.Error()))
}

// checkPosture refuses a Pod the API server stored with less than was asked (a mutating
// admission webhook can rewrite a Pod on its way in): another RuntimeClass or none, or
// another seccomp profile. What runs is what was asked for, or nothing.
func checkPosture(asked, made *corev1.Pod) error {
	var diff []string
	if a, m := deref(asked.Spec.RuntimeClassName), deref(made.Spec.RuntimeClassName); a != m {
		diff = append(diff, fmt.Sprintf("runtime class %q, not %q", m, a))
	}
	if a, m := podSeccomp(asked), podSeccomp(made); a != m {
		diff = append(diff, fmt.Sprintf("Pod seccomp %s, not %s", m, a))
	}
	// gVisor's shim takes its settings from annotations (gvisor.go): those asked for, no
	// fewer (the mount hints that size /tmp and /dev/shm) and no others.
	for k, v := range made.Annotations {
		if a, ok := asked.Annotations[k]; strings.HasPrefix(k, gvisorAnnotations) && (!ok || a != v) {
			diff = append(diff, fmt.Sprintf("annotation %s=%q, not asked for", k, v))
		}
	}
	for k, v := range asked.Annotations {
		if m, ok := made.Annotations[k]; strings.HasPrefix(k, gvisorAnnotations) && (!ok || m != v) {
			diff = append(diff, fmt.Sprintf("annotation %s %q, not %q", k, m, v))
		}
	}
	containers := map[string]corev1.Container{}
	for _, c := range append(append([]corev1.Container(nil), made.Spec.InitContainers...), made.Spec.Containers...) {
		containers[c.Name] = c
	}
	for _, a := range append(append([]corev1.Container(nil), asked.Spec.InitContainers...), asked.Spec.Containers...) {
		m, ok := containers[a.Name]
		if !ok {
			diff = append(diff, "no container "+a.Name)
			continue
		}
		if as, ms := containerSeccomp(a), containerSeccomp(m); as != ms {
			diff = append(diff, fmt.Sprintf("container %s seccomp %s, not %s", a.Name, ms, as))
		}
	}
	if len(diff) == 0 {
		return nil
	}
	return fmt.Errorf("%w: the cluster stored the Pod of sandbox %s with %s (a mutating admission webhook?): it is removed rather than run with less isolation than asked",
		roche.ErrUnavailable, made.Name, strings.Join(diff, ", "))
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func podSeccomp(pod *corev1.Pod) string {
	if pod.Spec.SecurityContext == nil {
		return describeSeccomp(nil)
	}
	return describeSeccomp(pod.Spec.SecurityContext.SeccompProfile)
}

func containerSeccomp(c corev1.Container) string {
	if c.SecurityContext == nil {
		return describeSeccomp(nil)
	}
	return describeSeccomp(c.SecurityContext.SeccompProfile)
}

func describeSeccomp(sp *corev1.SeccompProfile) string {
	switch {
	case sp == nil:
		return "unset"
	case sp.Type == corev1.SeccompProfileTypeLocalhost:
		return "Localhost/" + deref(sp.LocalhostProfile)
	}
	return string(sp.Type)
}

// sandboxFailures watches, while a Pod is pending, for the kubelet's FailedCreatePodSandBox
// events, which leave no trace in the Pod's status: the Pod stays Pending while the kubelet
// retries. Events are read at most once a second, and not at all once the API server
// refuses them (credentials without events access).
type sandboxFailures struct {
	last    time.Time
	off     bool
	message string
}

// check returns the latest FailedCreatePodSandBox message of pod, "" when there is none.
func (f *sandboxFailures) check(ctx context.Context, p *Provider, pod *corev1.Pod) string {
	if f.off || pod.Spec.NodeName == "" || time.Since(f.last) < time.Second {
		return f.message
	}
	f.last = time.Now()
	sel := fields.SelectorFromSet(fields.Set{
		"involvedObject.kind": "Pod", "involvedObject.name": pod.Name, "involvedObject.uid": string(pod.UID),
		"reason": "FailedCreatePodSandBox",
	}).String()
	evs, err := p.cs.CoreV1().Events(p.namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		if apierrors.IsForbidden(err) {
			f.off = true
		}
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

// runtimeHandlerMissing reports whether a FailedCreatePodSandBox message says the node
// cannot run the RuntimeClass asked for (no such RuntimeClass, or no such handler in the
// node's runtime): the kubelet retries that for ever, so the create fails at once.
func runtimeHandlerMissing(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "runtimeclass") || strings.Contains(m, "runtime handler") ||
		strings.Contains(m, "runtimehandler") || strings.Contains(m, "no runtime for")
}
