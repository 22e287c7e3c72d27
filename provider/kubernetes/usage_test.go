package kubernetes_test

import (
	"testing"

	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestUsage: the console's live figures of a kubernetes sandbox, read by its own
// roche-agent from the Pod's cgroup (no kubelet right needed): they grow by what a
// command in it keeps and burns.
func TestUsage(t *testing.T) {
	p := newProvider(t)
	cfg := baseConfig()
	cfg.Memory = "384m"
	sb := create(t, p, cfg)
	providertest.UsageGrows(t, p, sb.ID)
}
