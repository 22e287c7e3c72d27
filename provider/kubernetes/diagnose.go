package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Diagnoser = (*Provider)(nil)

// KubeconfigFix is the command that points the provider at a cluster (roche doctor's
// fix for one not configured or whose kubeconfig cannot be read).
const KubeconfigFix = "export KUBECONFIG=/path/to/kubeconfig"

// Diagnose implements kit.Diagnoser: a cluster configured (Available), its API server
// answering /version, and an agent image to run. The image is the nodes' to have: the
// provider imports nothing.
func (p *Provider) Diagnose(ctx context.Context, _ string) []kit.Finding {
	if p.noCluster != nil {
		return []kit.Finding{kit.Lacks("kubeconfig", p.noCluster, KubeconfigFix, false)}
	}
	out := []kit.Finding{kit.Found("kubeconfig", nil, p.where)}
	host := p.where
	if p.rest != nil {
		host = p.rest.Host
	}
	body, err := p.cs.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(ctx)
	if err != nil {
		// No command starts someone's cluster: the error says where it was looked for.
		return append(out, kit.Found("cluster", fmt.Errorf("%w: the Kubernetes API server at %s does not answer: %s", roche.ErrUnavailable, host, oneLine(err.Error())), ""))
	}
	var v struct {
		GitVersion string `json:"gitVersion"`
	}
	_ = json.Unmarshal(body, &v)
	out = append(out, kit.Found("cluster", nil, fmt.Sprintf("Kubernetes %s at %s", v.GitVersion, host)))
	if p.noAgent != nil {
		return append(out, kit.Found("agent image", p.noAgent, ""))
	}
	return append(out, kit.Found("agent image", nil, p.agentImage))
}
