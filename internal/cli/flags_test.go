package cli

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestProviderFlagsRefused: a provider's flag given to a command whose provider does
// not read it would be dropped, and an isolation flag dropped is a silent downgrade
// (--runtime runsc asked for gVisor, an oci sandbox runs on runc). Each is refused in
// one line naming the provider the flag is for and what the command's provider takes
// instead, before anything is made, by the real binaries: the thin roche in direct mode
// (before it hands the command to the full binary), the full roche (roched started as
// roche, providers in-process), and the thin roche through a real roched.
func TestProviderFlagsRefused(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	rocheBin, rochedBin := buildBinaries(t)
	socket := startRoched(t, rochedBin)
	img := testImage()
	// An owner of the test's own, so that the lists below see only what it may have made.
	owner := "cli:flags-test-" + strings.TrimPrefix(img, "roche/python:")
	type run func(args ...string) result
	exe := func(path, argv0 string, global ...string) run {
		return func(args ...string) result {
			cmd := exec.Command(path, append(slices.Clone(global), args...)...)
			cmd.Args[0] = argv0
			cmd.Env = append(environWithout("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "ROCHE_PROVIDER", "ROCHE_OWNER"), "ROCHE_OWNER="+owner)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			var ee *exec.ExitError
			code := 0
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatalf("running %s: %v", path, err)
			}
			return result{code, out.String(), errb.String()}
		}
	}
	modes := map[string]run{
		"thin-direct": exe(rocheBin, "roche", "--direct"),
		"full-direct": exe(rochedBin, "roche", "--direct"),
		"daemon":      exe(rocheBin, "roche", "--socket", socket),
	}
	// Should a refusal fail to come, what was made goes with the test.
	t.Cleanup(func() {
		modes["daemon"]("destroy", "--all")
		modes["thin-direct"]("destroy", "--all")
	})
	const (
		forRuntime      = "for docker use --runtime (runc, or runsc for gVisor)"
		forOCIRuntime   = "for oci use --oci-runtime (crun or runc)"
		forRuntimeClass = "for kubernetes use --runtime-class"
	)
	cases := []struct {
		args []string
		says string
	}{
		{[]string{"run", "--provider", "oci", "--runtime", "runsc", "--image", img, "--", "true"},
			"--runtime is the docker provider's, and this command uses oci: " + forOCIRuntime + "; or leave --runtime out"},
		{[]string{"run", "--provider", "kubernetes", "--runtime", "runsc", "--image", img, "--", "true"},
			"--runtime is the docker provider's, and this command uses kubernetes: " + forRuntimeClass},
		{[]string{"run", "--provider", "kubernetes", "--runtime", "bogus", "--image", img, "--", "true"},
			"--runtime is the docker provider's, and this command uses kubernetes: " + forRuntimeClass},
		{[]string{"run", "--provider", "docker", "--runtime-class", "gvisor", "--image", img, "--", "true"},
			"--runtime-class is the kubernetes provider's, and this command uses docker: " + forRuntime},
		{[]string{"create", "--provider", "oci", "--runtime-class", "gvisor", "--image", img},
			"--runtime-class is the kubernetes provider's, and this command uses oci: " + forOCIRuntime},
		{[]string{"create", "--provider", "docker", "--oci-runtime", "crun", "--image", img},
			"--oci-runtime is the oci provider's, and this command uses docker: " + forRuntime},
		{[]string{"create", "--provider", "oci", "--seccomp-profile", "roche.json", "--image", img},
			"--seccomp-profile is the kubernetes provider's, and this command uses oci: oci sandboxes always run Roche's own seccomp profile"},
		{[]string{"create", "--provider", "wasm", "--kubeconfig", "/nonexistent"},
			"--kubeconfig is the kubernetes provider's, and this command uses wasm: leave --kubeconfig out, or use the kubernetes provider"},
		{[]string{"create", "--provider", "docker", "--namespace", "roche", "--image", img},
			"--namespace is the kubernetes provider's, and this command uses docker"},
		{[]string{"create", "--provider", "docker", "--agent-image", "roche/agent:x", "--image", img},
			"--agent-image is the kubernetes provider's, and this command uses docker"},
		{[]string{"create", "--provider", "oci", "--transport", "docker-exec", "--image", img},
			"--transport is the docker provider's, and this command uses oci"},
		{[]string{"exec", "--sandbox", "wasm-0123456789ab", "--runtime", "runsc", "--", "true"},
			"--runtime is the docker provider's, and this command uses wasm"},
		{[]string{"list", "--provider", "qemu", "--oci-runtime", "runc"},
			"--oci-runtime is the oci provider's, and this command uses qemu"},
		{[]string{"pool", "status", "--runtime", "runsc"},
			"--runtime runsc is the docker provider's, and roche pool status opens no provider"},
		{[]string{"daemon", "start", "--socket", filepath.Join(socketDir(t), "never.sock"), "--roched", rochedBin, "--transport", "docker-exec"},
			"--transport docker-exec: roched's Docker sandboxes always run commands through roche-agent"},
	}
	for name, roche := range modes {
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				r := roche(c.args...)
				want := 1
				if c.args[0] == "run" || c.args[0] == "exec" {
					want = exitRocheFailed
				}
				if r.code != want || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 ||
					!strings.HasPrefix(r.stderr, "roche: invalid config: ") || !strings.Contains(r.stderr, c.says) {
					t.Errorf("roche %s: exit %d, stdout %q, stderr %q; want exit %d and one line saying %q",
						strings.Join(c.args, " "), r.code, r.stdout, r.stderr, want, c.says)
				}
			}
			// Nothing was made on the way.
			for _, p := range []string{"docker", "oci"} {
				if r := modes["thin-direct"]("list", "--provider", p, "--json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
					t.Errorf("%s sandboxes of this test after the refusals: %+v", p, r)
				}
			}
		})
	}

	// Through roched, a flag of the provider roched runs would apply only to sandboxes
	// made in this process: roched makes them with its own settings.
	if r := modes["daemon"]("run", "--provider", "docker", "--runtime", "runsc", "--image", img, "--", "true"); r.code != exitRocheFailed ||
		!strings.Contains(r.stderr, "roche: invalid config: --runtime runsc applies to the docker sandboxes this process makes, and roched makes them here, with its own settings (roched --help): pass --direct as well") {
		t.Errorf("run --runtime runsc through roched: %+v", r)
	}
	// The flags that go together still work.
	if r := modes["thin-direct"]("run", "--provider", "docker", "--runtime", "runc", "--image", img, "--", "echo", "ok"); r.code != 0 || r.stdout != "ok\n" {
		t.Errorf("run --provider docker --runtime runc: %+v", r)
	}
	// roche daemon start passes the providers' flags on to roched, which refuses a bad one.
	never := filepath.Join(socketDir(t), "never.sock")
	if r := modes["thin-direct"]("daemon", "start", "--socket", never, "--roched", rochedBin, "--runtime", "bogus"); r.code != 1 ||
		!strings.Contains(r.stderr, `roched exited at start`) || !strings.Contains(r.stderr, `runtime "bogus": use runc or runsc`) {
		t.Errorf("daemon start --runtime bogus: %+v", r)
	}
}

// TestRochedProviderFlags: roched refuses, in one line and before it listens, a flag of
// a provider it does not serve (--providers), and a provider asked for (by --providers
// or by one of its flags) that is not set up at all.
func TestRochedProviderFlags(t *testing.T) {
	_, rochedBin := buildBinaries(t)
	env := environWithout("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "ROCHE_TOKEN")
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--providers", "oci", "--runtime", "runsc"},
			"roched: invalid config: --runtime is the docker provider's, and roched serves only oci: for oci use --oci-runtime (crun or runc); or leave --runtime out"},
		{[]string{"--providers", "docker,wasm", "--runtime-class", "gvisor"},
			"roched: invalid config: --runtime-class is the kubernetes provider's, and roched serves only docker, wasm: for docker use --runtime (runc, or runsc for gVisor); or leave --runtime-class out"},
		{[]string{"--providers", "docker", "--seccomp-profile", "roche.json"},
			"roched: invalid config: --seccomp-profile is the kubernetes provider's, and roched serves only docker: docker sandboxes always run Roche's own seccomp profile"},
		{[]string{"--providers", "docker,kubernetes", "--oci-runtime", "crun"},
			"roched: invalid config: --oci-runtime is the oci provider's, and roched serves only docker, kubernetes: for docker use --runtime (runc, or runsc for gVisor); for kubernetes use --runtime-class"},
		{[]string{"--providers", "docker", "--kube-qps", "400"},
			"roched: invalid config: --kube-qps is the kubernetes provider's, and roched serves only docker: leave --kube-qps out, or use the kubernetes provider"},
		{[]string{"--runtime-class", "gvisor"},
			"roched: the kubernetes provider is not set up, and --runtime-class gvisor asks for it: provider unavailable: no Kubernetes cluster configured: pass --kubeconfig, set KUBECONFIG, or run inside a cluster"},
		{[]string{"--providers", "kubernetes"},
			"roched: the kubernetes provider is not set up, and --providers names it: provider unavailable: no Kubernetes cluster configured"},
	} {
		socket := filepath.Join(socketDir(t), "r.sock")
		// A roched that does not refuse serves until this ends it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, rochedBin, append([]string{"--socket", socket, "--state", filepath.Join(t.TempDir(), "state.json")}, c.args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("roched %s: %v, want exit status 1; output:\n%s", strings.Join(c.args, " "), err, out)
			continue
		}
		// The refusal is the last line, and the only one not from the log.
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if last := lines[len(lines)-1]; !strings.HasPrefix(last, c.says) {
			t.Errorf("roched %s said %q, want %q", strings.Join(c.args, " "), last, c.says)
		}
		if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("roched %s listened on %s before refusing: %v", strings.Join(c.args, " "), socket, err)
		}
	}
}

// environWithout is this process's environment without the named variables.
func environWithout(names ...string) []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, k)
	})
}

// TestMCPCreatesCheckFlags: roche mcp's creates open their provider as the CLI's
// commands do, so a flag of another provider is refused there too.
func TestMCPCreatesCheckFlags(t *testing.T) {
	r := newRegistry(slog.New(slog.DiscardHandler), testLocal, nil)
	defer r.close()
	r.runtime = "runsc"
	p, err := registryProviders{&env{providers: r}}.Get("oci")
	if p != nil || !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "--runtime is the docker provider's, and this command uses oci") {
		t.Fatalf("an MCP create on oci with --runtime runsc: %v, %v", p, err)
	}
}
