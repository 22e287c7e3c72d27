package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
)

// An https:// entry given live to a sandbox made without a CA is refused, changing
// nothing: its proxy could only refuse every connection the entry names.
func TestEgressPolicyHTTPSNeedsCA(t *testing.T) {
	pol, _ := egress.ParsePolicy([]string{"pypi.org"})
	px := egress.New(egress.Options{Policy: pol})
	defer px.Close()
	err := changePolicy(px, []string{"GET https://api.example.com/v1/"}, nil)
	if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "no egress CA") {
		t.Fatalf("https:// entry without a CA: %v, want ErrInvalidConfig naming the CA", err)
	}
	if got := px.Policy().Rules; len(got) != 1 {
		t.Fatalf("the allowlist changed: %v", got)
	}
	ca, err := egress.NewCA("t")
	if err != nil {
		t.Fatal(err)
	}
	px2 := egress.New(egress.Options{Policy: pol, CA: ca})
	defer px2.Close()
	if err := changePolicy(px2, []string{"GET https://api.example.com/v1/"}, nil); err != nil || len(px2.Policy().Rules) != 2 {
		t.Fatalf("https:// entry with a CA: %v %v", err, px2.Policy().Rules)
	}
}
