package e2b_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/e2b"
)

// TestListenChecks: --e2b-listen is refused in plaintext on an address others can reach,
// as --listen is, unless --insecure or TLS; a malformed address is refused with the form.
func TestListenChecks(t *testing.T) {
	for _, c := range []struct {
		cfg  daemon.Config
		want string // "" for accepted
	}{
		{daemon.Config{E2BListen: "tcp://127.0.0.1:3000"}, ""},
		{daemon.Config{E2BListen: "tcp://0.0.0.0:3000"}, "refusing plaintext TCP on --e2b-listen tcp://0.0.0.0:3000"},
		{daemon.Config{E2BListen: "tcp://0.0.0.0:3000", Insecure: true}, ""},
		{daemon.Config{E2BListen: "tcp://0.0.0.0:3000", TLSCert: "c.pem", TLSKey: "k.pem"}, ""},
		{daemon.Config{E2BListen: "tcp://0.0.0.0:3000", TLSCert: "c.pem"}, "give both --tls-cert FILE and --tls-key FILE"},
		{daemon.Config{E2BListen: "127.0.0.1:3000"}, "use tcp://HOST:PORT"},
	} {
		err := c.cfg.Validate([]string{"docker"})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: refused: %v", c.cfg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: got %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestBadSettings: the config file's "e2b" section refuses a typo and a template with no
// image, naming them, when roched starts.
func TestBadSettings(t *testing.T) {
	for raw, want := range map[string]string{
		`{"templats": {}}`:                       `unknown field "templats"`,
		`{"templates": {"x": {"memory": "1g"}}}`: `template "x" names no image`,
	} {
		_, err := e2b.New(nil, daemon.FrontendSettings{Raw: json.RawMessage(raw)})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", raw, err, want)
		}
	}
}
