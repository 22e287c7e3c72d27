package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

// --secret takes the value from a private file only, and --secret-host and
// --secret-header name a --secret.
func TestSecretFlags(t *testing.T) {
	dir := t.TempDir()
	private := filepath.Join(dir, "tok")
	if err := os.WriteFile(private, []byte("v4lue-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &createFlags{secrets: []string{"API_TOKEN=@" + private}, secretHosts: []string{"API_TOKEN=api.example.com", "API_TOKEN=api.example.com:8443"},
		secretHeaders: []string{"API_TOKEN=Authorization"}}
	got, err := f.parseSecrets()
	if err != nil || len(got) != 1 || got[0].Value != "v4lue-from-file" || got[0].Header != "Authorization" ||
		strings.Join(got[0].Hosts, " ") != "api.example.com api.example.com:8443" {
		t.Fatalf("parseSecrets = %+v, %v", got, err)
	}
	for _, bad := range []struct {
		f    createFlags
		want string
	}{
		{createFlags{secrets: []string{"API_TOKEN=literal"}}, "give NAME=@FILE"},
		{createFlags{secrets: []string{"API_TOKEN=@" + open}}, "open to group or others"},
		{createFlags{secrets: []string{"API_TOKEN=@" + filepath.Join(dir, "none")}}, "no such file"},
		{createFlags{secretHosts: []string{"OTHER=api.example.com"}}, "add --secret OTHER=@FILE, or --secret OTHER"},
		{createFlags{secrets: []string{"A=@" + private}, secretHeaders: []string{"A"}}, "give NAME=VALUE"},
	} {
		_, err := bad.f.parseSecrets()
		if err == nil || !strings.Contains(err.Error(), bad.want) || strings.Contains(err.Error(), "literal") {
			t.Errorf("%+v: %v, want an error saying %q without the value", bad.f, err, bad.want)
		}
	}
	// Through config(): a secret needs an allowlist and a host.
	def := roche.DefaultConfig()
	f = &createFlags{secrets: []string{"API_TOKEN=@" + private}, image: def.Image, memory: def.Memory, disk: def.Disk,
		cpus: def.CPUs, timeout: def.TimeoutSecs, pidsLimit: def.PidsLimit, user: def.User}
	if _, err := f.config(); err == nil || !strings.Contains(err.Error(), "--secret-host API_TOKEN=HOST") {
		t.Errorf("a secret bound to no host: %v", err)
	}
}
