package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/internal/wire"
)

// TestHealthzSaysWhatCannotWork: a roched asked to serve wasm on a host without
// python.wasm answers /healthz with 200 but "degraded", naming wasm and why (and the
// version roched --version prints); asked for docker only, the same host is "ok".
func TestHealthzSaysWhatCannotWork(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	get := func(t *testing.T, socket string) (int, wire.Health) {
		t.Helper()
		hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}}}
		resp, err := hc.Get("http://roched/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var h wire.Health
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, h
	}
	dir := shortDir(t)
	env := []string{"XDG_RUNTIME_DIR=" + filepath.Join(dir, "run"), "ROCHE_PYTHON_WASM=" + filepath.Join(dir, "no", "python.wasm")}

	socket := filepath.Join(dir, "w.sock")
	r := startRochedEnv(t, socket, env, "--providers", "docker,wasm")
	code, h := get(t, socket)
	if code != http.StatusOK || h.Status != "degraded" || !strings.Contains(h.Unavailable["wasm"], "python.wasm") {
		t.Errorf("/healthz of a roched asked for wasm without python.wasm: %d %+v, want 200, degraded, and why wasm cannot work", code, h)
	}
	var out, errb bytes.Buffer
	Main([]string{"--version"}, &out, &errb)
	if want := buildinfo.Version(); h.Version != want || out.String() != "roched "+want+"\n" {
		t.Errorf("/healthz says version %q, roched --version %q: want both %q", h.Version, out.String(), want)
	}
	stopRoched(t, r)

	socket = filepath.Join(dir, "d.sock")
	r = startRochedEnv(t, socket, env, "--providers", "docker")
	if code, h := get(t, socket); code != http.StatusOK || h.Status != "ok" || len(h.Unavailable) != 0 {
		t.Errorf("/healthz of a roched serving docker alone: %d %+v, want ok", code, h)
	}
	stopRoched(t, r)
}
