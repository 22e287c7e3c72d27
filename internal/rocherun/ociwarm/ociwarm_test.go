package ociwarm

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWarms: roche-run begins the warm-up early only for a one-shot oci run it makes
// itself, as root: not for one it hands to roched (ROCHE_ADDRESS, a file at roched's
// socket), another provider's, or a user's.
func TestWarms(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "roched.sock")
	oci := []string{"run", "--provider", "oci", "--", "true"}
	env := func(kv ...string) func(string) string {
		m := map[string]string{"ROCHE_SOCKET": socket}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	if !warms(oci, env(), 0) {
		t.Fatal("a one-shot oci run as root with no roched: no early warm-up")
	}
	for _, c := range []struct {
		name   string
		args   []string
		getenv func(string) string
		euid   int
	}{
		{"not root", oci, env(), 1000},
		{"docker", []string{"run", "--provider", "docker", "--", "true"}, env(), 0},
		{"not a run", []string{"list"}, env(), 0},
		{"ROCHE_ADDRESS", oci, env("ROCHE_ADDRESS", "http://127.0.0.1:1"), 0},
	} {
		if warms(c.args, c.getenv, c.euid) {
			t.Errorf("%s: an early warm-up", c.name)
		}
	}
	if err := os.WriteFile(socket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if warms(oci, env(), 0) {
		t.Error("roched's socket there: an early warm-up for a run roched makes")
	}
}
