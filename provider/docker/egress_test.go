package docker_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/docker/docker/client"

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
	cfg.NetworkAllowlist = []string{"http://pypi.org/simple"}
	if _, err := p.Create(context.Background(), cfg); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("a URL as an entry: %v, want ErrInvalidConfig", err)
	}
}

func TestEgressInterceptAndSecrets(t *testing.T) {
	p := newProvider(t, docker.WithEgressProxy())
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	id, value := providertest.EgressIntercept(t, p, testConfig(), func(cfg roche.Config) string { return sandbox(t, p, cfg) },
		func(id string) ([]int, error) { return containerPIDs(cli, id) })
	// From the host: the container's config.
	_, raw, err := cli.ContainerInspectWithRaw(context.Background(), id, false)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), value) {
		t.Error("the container's config holds the secret")
	}
	if !strings.Contains(string(raw), "API_TOKEN=roche-secret-") {
		t.Error("the container's config lacks the placeholder: the check above looked at the wrong thing")
	}
}

// containerPIDs are the host's pids of the processes of container id.
func containerPIDs(cli *client.Client, id string) ([]int, error) {
	procs, err := cli.ContainerTop(context.Background(), id, []string{"-o", "pid"})
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, pr := range procs.Processes {
		pid, err := strconv.Atoi(strings.TrimSpace(pr[0]))
		if err != nil {
			return nil, fmt.Errorf("docker top: pid %q", pr[0])
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
