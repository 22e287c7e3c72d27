package kubernetes_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestAgentImageNeverPulled: an agent image named after the local roche-agent is in no
// registry, so a node without it must not send the kubelet to one (a public registry, by
// default): the Pod never pulls it (ErrImageNeverPull, not ErrImagePull), and the create
// fails with ErrImageNotFound naming the command that imports it, leaving no Pod.
func TestAgentImageNeverPulled(t *testing.T) {
	b, err := os.ReadFile(os.Getenv("ROCHE_AGENT"))
	if err != nil {
		t.Fatal(err)
	}
	// The suite's agent, one byte longer: an image no node has.
	other := filepath.Join(t.TempDir(), "roche-agent")
	if err := os.WriteFile(other, append(b, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ROCHE_AGENT", other)
	p := newProvider(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	_, err = p.Create(ctx, cfg)
	if !errors.Is(err, roche.ErrImageNotFound) || !strings.Contains(err.Error(), "ErrImageNeverPull") ||
		!strings.Contains(err.Error(), p.AgentImage()) ||
		!strings.Contains(err.Error(), "roche kubernetes agent-image --output roche-agent.tar && ctr -n k8s.io images import roche-agent.tar") ||
		!strings.Contains(err.Error(), "make cluster") {
		t.Fatalf("a create whose agent image no node has: %v, want ErrImageNotFound from a Pod that never pulls, naming the import", err)
	}
	pods, err := clientset(t).CoreV1().Pods(p.Namespace()).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("Pods left after the refused create: %v %v", pods, err)
	}
}
