package oci_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/oci"
	"github.com/roche-sandbox/roche/provider/providertest"
)

func TestMain(m *testing.M) {
	// Every exec, copy and attach must have let go of its goroutines.
	os.Exit(testenv.RunWithAgent(m))
}

// testDirs are the state and data directories of one test's provider: its own, so that
// what it leaves (or not) is its alone.
func newProvider(t *testing.T, opts ...oci.Option) (*oci.Provider, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the oci provider needs root (the README's test command runs as root)")
	}
	state := filepath.Join("/run/roche-test", "oci-"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	data := filepath.Join("/var/lib/roche-test/oci")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	opts = append([]oci.Option{oci.WithStateDir(state), oci.WithDataDir(data)}, opts...)
	p, err := oci.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		checkNothingLeft(t, p, state)
	})
	return p, state
}

// checkNothingLeft: no container in the runtime's state, no mount below the state or
// disk directories, no cgroup and no sandbox directory.
func checkNothingLeft(t *testing.T, p *oci.Provider, state string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, err := p.Runtime(ctx)
	if err != nil {
		t.Errorf("runtime: %v", err)
		return
	}
	out, err := exec.Command(name, "--root", filepath.Join(state, "runtime", name), "list", "-q").CombinedOutput()
	if err != nil {
		t.Errorf("%s list: %v: %s", name, err, out)
	} else if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("containers left in %s's state: %s", name, s)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, state+"/") || strings.Contains(line, "/var/lib/roche-test/oci/sandboxes/") {
			t.Errorf("mount left: %s", line)
		}
	}
	entries, _ := os.ReadDir(state)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), oci.Name+"-") {
			t.Errorf("sandbox directory left: %s", e.Name())
		}
	}
	if cg, _ := filepath.Glob("/sys/fs/cgroup/*/roche-oci-*"); len(cg) > 0 {
		t.Errorf("cgroups left: %v", cg)
	}
	if d, _ := os.ReadDir("/var/lib/roche-test/oci/sandboxes"); len(d) > 0 {
		t.Errorf("sandbox disks left: %d", len(d))
	}
}

func testConfig() roche.Config {
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	return cfg
}

func TestHello(t *testing.T) {
	p, _ := newProvider(t)
	ctx := context.Background()
	start := time.Now()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("created %s in %v", info.ID, time.Since(start))
	defer p.Destroy(ctx, info.ID)
	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('hello')"}})
	if err != nil || res.Stdout != "hello\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
}

func TestConformance(t *testing.T) {
	p, _ := newProvider(t)
	providertest.Run(t, p, providertest.Options{Config: testConfig()})
}
