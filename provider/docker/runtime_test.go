package docker_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
)

// TestRuntimeChoice: runc and runsc are taken, runc by default; anything else is refused
// with what to choose, and gVisor, without a network stack here, says it has none.
func TestRuntimeChoice(t *testing.T) {
	for rt, want := range map[string]string{"": docker.RuntimeRunc, "runc": docker.RuntimeRunc, "runsc": docker.RuntimeGVisor} {
		p, err := docker.New(docker.WithRuntime(rt))
		if err != nil {
			t.Fatalf("runtime %q: %v", rt, err)
		}
		if p.Runtime() != want {
			t.Errorf("runtime %q: got %q, want %q", rt, p.Runtime(), want)
		}
		if got := p.Capabilities().Network; got != (want == docker.RuntimeRunc) {
			t.Errorf("runtime %q: Capabilities().Network %v", rt, got)
		}
		p.Close()
	}
	_, err := docker.New(docker.WithRuntime("kata"))
	if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "runsc") {
		t.Fatalf("runtime kata: %v, want ErrInvalidConfig naming the choices", err)
	}
}
