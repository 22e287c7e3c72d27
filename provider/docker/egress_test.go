package docker_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/providertest"
)

func TestEgressAllowlist(t *testing.T) {
	p := newProvider(t, docker.WithEgressProxy())
	if !p.Capabilities().Egress {
		t.Fatal("Capabilities().Egress is false with the proxy on")
	}
	providertest.Egress(t, p, testConfig(), func(cfg roche.Config) string { return sandbox(t, p, cfg) })
}

func TestEgressNeedsALongLivedProcess(t *testing.T) {
	p := newProvider(t)
	cfg := testConfig()
	cfg.NetworkAllowlist = []string{"pypi.org"}
	_, err := p.Create(context.Background(), cfg)
	if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "roched") {
		t.Fatalf("allowlist without the proxy: %v, want ErrUnsupported naming roched", err)
	}
	cfg.NetworkAllowlist = []string{"https://pypi.org/simple"}
	if _, err := p.Create(context.Background(), cfg); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("a URL as an entry: %v, want ErrInvalidConfig", err)
	}
}
