package oci_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/oci"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// runtimePIDs returns the host's pids of an oci sandbox's processes, from its runtime's
// ps (the provider keeps the runtime's state below its state directory).
func runtimePIDs(p *oci.Provider, state string) func(id string) ([]int, error) {
	return func(id string) ([]int, error) {
		name, err := p.Runtime(context.Background())
		if err != nil {
			return nil, err
		}
		out, err := exec.Command(name, "--root", filepath.Join(state, "runtime", name), "ps", "--format", "json", id).Output()
		if err != nil {
			return nil, fmt.Errorf("%s ps %s: %v", name, id, err)
		}
		var pids []int
		if err := json.Unmarshal(out, &pids); err != nil {
			return nil, fmt.Errorf("%s ps %s printed %q: %v", name, id, out, err)
		}
		return pids, nil
	}
}

// TestEgressInterceptAndSecrets: the conformance check of interception and secrets
// (also in TestConformance), and, from the host, that no file the provider keeps for the
// sandbox (its record, its runtime spec, the egress files; the root is searched from
// inside) holds the secret's value.
func TestEgressInterceptAndSecrets(t *testing.T) {
	p, state := newProvider(t, oci.WithEgressProxy())
	ctx := context.Background()
	id, value := providertest.EgressIntercept(t, p, testConfig(), func(cfg roche.Config) string {
		info, err := p.Create(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Destroy(ctx, info.ID) })
		return info.ID
	}, runtimePIDs(p, state))
	dir := filepath.Join(state, id)
	spec, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(spec), "API_TOKEN=roche-secret-") {
		t.Fatal("the sandbox's runtime spec lacks the placeholder: the search below would look at the wrong files")
	}
	files := 0
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if d != nil && d.IsDir() && d.Name() == "rootfs" {
			return fs.SkipDir // the sandbox's own files, searched from inside
		}
		if err != nil || !d.Type().IsRegular() {
			return nil // the root's mount, sockets, what went away
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		files++
		if strings.Contains(string(b), value) || strings.Contains(string(b), "PRIVATE KEY") {
			t.Errorf("%s holds the secret or a private key", path)
		}
		return nil
	})
	if err != nil || files < 3 {
		t.Errorf("searched %d files of %s: %v", files, dir, err)
	}
}

// TestEgressTrustOutOfReach: a root sandbox can neither touch its trust files nor find a
// file of the host's in its socket directory (the provider keeps them one level up).
func TestEgressTrustOutOfReach(t *testing.T) {
	p, _ := newProvider(t, oci.WithEgressProxy())
	ctx := context.Background()
	providertest.EgressTrustOutOfReach(t, p, testConfig(), func(cfg roche.Config) string {
		info, err := p.Create(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Destroy(ctx, info.ID) })
		return info.ID
	})
}
