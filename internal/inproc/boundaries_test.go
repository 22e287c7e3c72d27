package inproc

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/roche-sandbox/roche"

// providerOf names the provider a package belongs to: "vm" for provider/vm and
// provider/vm/supervisor; "" for a package that is no provider's (the shared code under
// provider/internal, the provider authors' kit, the conformance suite, anything outside
// provider/).
func providerOf(pkg string) string {
	rest, ok := strings.CutPrefix(pkg, module+"/provider/")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(rest, "/")
	if name == "internal" || name == "kit" || name == "providertest" {
		return ""
	}
	return name
}

// linked is what each package of patterns links (go list's Deps), for GOOS goos.
func linked(t *testing.T, goos string, patterns ...string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-f", "{{.ImportPath}} {{join .Deps \" \"}}"}, patterns...)...)
	cmd.Env = append(os.Environ(), "GOOS="+goos)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s (GOOS=%s): %v", strings.Join(patterns, " "), goos, err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		deps[f[0]] = f[1:]
	}
	return deps
}

// TestProvidersLinkNoOtherProvider: no provider links another provider's package (what
// they share lives under provider/internal), and the kubernetes provider links no
// Docker SDK; on Linux and on a host without Linux's files.
func TestProvidersLinkNoOtherProvider(t *testing.T) {
	for _, goos := range []string{"linux", "darwin"} {
		all := linked(t, goos, module+"/provider/...")
		providers := map[string]bool{}
		for pkg, deps := range all {
			own := providerOf(pkg)
			if own == "" {
				continue
			}
			providers[own] = true
			var sdk []string
			for _, d := range deps {
				if other := providerOf(d); other != "" && other != own {
					t.Errorf("GOOS=%s: %s links %s: move what they share under provider/internal", goos, pkg, d)
				}
				if strings.HasPrefix(d, "github.com/docker/docker/") {
					sdk = append(sdk, d)
				}
			}
			if own == "kubernetes" && len(sdk) > 0 {
				t.Errorf("GOOS=%s: %s links the Docker SDK (%d packages: %s, ...)", goos, pkg, len(sdk), sdk[0])
			}
		}
		// The check sees every provider, and would see a provider linked: this package
		// links them all.
		for _, want := range []string{"docker", "kubernetes", "oci", "vm", "wasm"} {
			if !providers[want] {
				t.Errorf("GOOS=%s: go list found no package of provider %s", goos, want)
			}
		}
		self := linked(t, goos, module+"/internal/inproc")[module+"/internal/inproc"]
		for _, want := range []string{"docker", "kubernetes", "oci", "vm", "wasm"} {
			if !slices.Contains(self, module+"/provider/"+want) {
				t.Errorf("GOOS=%s: the check does not see provider/%s among internal/inproc's dependencies", goos, want)
			}
		}
	}
}

// TestDaemonImportsNoProvider: roched's API edge imports no provider package; it links
// the providers only through this package.
func TestDaemonImportsNoProvider(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{join .Imports \"\\n\"}}", module+"/internal/daemon").Output()
	if err != nil {
		t.Fatalf("go list internal/daemon: %v", err)
	}
	imports := strings.Fields(string(out))
	if !slices.Contains(imports, module+"/internal/inproc") {
		t.Fatalf("internal/daemon does not import internal/inproc: the check reads the wrong list: %v", imports)
	}
	for _, imp := range imports {
		if providerOf(imp) != "" {
			t.Errorf("internal/daemon imports %s: take what it needs from internal/defaults or internal/catalog, and providers through internal/inproc", imp)
		}
	}
}
