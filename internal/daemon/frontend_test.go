package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

// TestFileConfigE2B: the config file's e2b_listen becomes Config.E2BListen unless
// --e2b-listen is given, and its e2b section is handed to the frontend undecoded.
func TestFileConfigE2B(t *testing.T) {
	path := filepath.Join(t.TempDir(), "roched.json")
	if err := os.WriteFile(path, []byte(`{"e2b_listen": "tcp://127.0.0.1:3000", "e2b": {"templates": {}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", path}, "tcp://127.0.0.1:3000"},
		{[]string{"--config", path, "--e2b-listen", "tcp://127.0.0.1:4000"}, "tcp://127.0.0.1:4000"},
	} {
		var f flags
		cmd := command(&f, os.Stderr)
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := buildConfig(cmd, &f)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.E2BListen != c.want || string(cfg.E2B) != `{"templates": {}}` {
			t.Errorf("%v: E2BListen %q, E2B %s", c.args, cfg.E2BListen, cfg.E2B)
		}
	}
}
