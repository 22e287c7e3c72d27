package kubernetes

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Simulated nodes: for scale tests and benchmarks of the control plane only (Pod objects,
// labels, list, reaping, a restarted roched's reconciliation) on a cluster whose nodes
// are simulated by kwok (sigs.k8s.io/kwok): a real API server, scheduler and controllers,
// and nodes that run no container. Sandboxes made this way run nothing: no agent answers
// in them, so commands, files and leases are refused. roched's flags cannot turn it on.

// SimulatedNodeTaint is the taint kwok's nodes carry (NoSchedule) so that no other Pod
// lands on them; sandboxes under WithSimulatedNodes tolerate it. scripts/k8s/cluster.sh
// up --kwok N taints its fake nodes so.
const SimulatedNodeTaint = "kwok.x-k8s.io/node"

// simulatedAgentImage names the init container's image under WithSimulatedNodes, where no
// image is pulled: it needs no local roche-agent.
const simulatedAgentImage = "roche/agent:simulated"

// simulation places sandboxes on simulated nodes (WithSimulatedNodes).
type simulation struct {
	nodeSelector map[string]string
}

// WithSimulatedNodes is for benchmarks and scale tests only: it schedules sandboxes onto
// the simulated (kwok) nodes that selector picks ("type=kwok": node labels, comma
// separated), tolerating SimulatedNodeTaint, and takes a Pod's Running phase as the
// sandbox ready, without waiting for an agent (none runs there). Under it Capabilities
// offers no commands, files or leases, and those calls are refused with
// roche.ErrUnsupported; create, inspect, list, destroy and gc work as they do on real
// nodes, with the same Pods, labels and API requests less the agent's.
func WithSimulatedNodes(selector string) Option {
	return func(p *Provider) {
		set, err := labels.ConvertSelectorToLabelsMap(selector)
		if err != nil || len(set) == 0 {
			p.badOption = fmt.Errorf("%w: simulated nodes %q: give node labels such as type=kwok", roche.ErrInvalidConfig, selector)
			return
		}
		p.sim = &simulation{nodeSelector: set}
	}
}

// WithTransportWrapper wraps the HTTP transport to the API server, as rest.Config.Wrap
// does: a benchmark counts the provider's requests with it.
func WithTransportWrapper(wrap func(http.RoundTripper) http.RoundTripper) Option {
	return func(p *Provider) { p.wrapTransport = wrap }
}

// Simulated reports whether sandboxes go to simulated nodes (WithSimulatedNodes).
func (p *Provider) Simulated() bool { return p.sim != nil }

// place puts a sandbox's Pod on the simulated nodes; without a simulation it does nothing.
func (s *simulation) place(pod *corev1.Pod) {
	if s == nil {
		return
	}
	pod.Spec.NodeSelector = s.nodeSelector
	pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{
		Key: SimulatedNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
	})
}

// capabilities are what a sandbox on a simulated node offers: its Pod's settings, and
// nothing that needs the agent.
func (s *simulation) capabilities() roche.Capabilities {
	return roche.Capabilities{Network: true, Writable: true}
}

// refuse says why a create cannot be served on simulated nodes: a lease and an egress
// allowlist need the agent.
func (s *simulation) refuse(cfg kit.Spec) error {
	switch {
	case s == nil:
	case cfg.Leased:
		return fmt.Errorf("%w: leased: sandboxes on simulated nodes run no agent to hold a lease", roche.ErrUnsupported)
	case len(cfg.NetworkAllowlist) > 0:
		return fmt.Errorf("%w: network_allowlist: sandboxes on simulated nodes run no agent to relay egress", roche.ErrUnsupported)
	case cfg.Workspace != "":
		return fmt.Errorf("%w: workspace: simulated nodes mount no volumes", roche.ErrUnsupported)
	}
	return nil
}

// probeSimulated is Probe on a simulated node, where no agent answers: a sandbox this
// provider made is taken as alive without a request, as the real Probe's open session
// is; another must have a Running Pod.
func (p *Provider) probeSimulated(ctx context.Context, id string) error {
	p.mu.Lock()
	_, known := p.verified[id]
	p.mu.Unlock()
	if known {
		return nil
	}
	pod, err := p.get(ctx, id)
	if err != nil {
		return err
	}
	if stateOf(pod) != roche.StateRunning {
		return fmt.Errorf("%w: sandbox %s is not running (its Pod is %s)", roche.ErrUnavailable, id, pod.Status.Phase)
	}
	p.remember(sandbox{id: id, expires: expiresOf(pod.Labels), cfg: configOf(pod), started: startOf(pod)})
	return nil
}

// unreachable is the error of a call that needs the agent of a sandbox on a simulated node.
func (s *simulation) unreachable(id string) error {
	return fmt.Errorf("%w: sandbox %s is on a simulated node (%s), where nothing runs: commands and files are not served",
		roche.ErrUnsupported, id, selectorString(s.nodeSelector))
}

func startOf(pod *corev1.Pod) time.Time {
	if pod.Status.StartTime == nil {
		return time.Time{}
	}
	return pod.Status.StartTime.Time
}

func selectorString(set map[string]string) string {
	return strings.ReplaceAll(labels.SelectorFromSet(set).String(), ",", ", ")
}
