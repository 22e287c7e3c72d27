package daemon

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/doctor"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestHealthzVerbose: GET /healthz?verbose is roche doctor's report of what roched
// serves: wasm without python.wasm names it and the command that fetches it, docker on
// runc works. Over TCP it needs the token, as the API does (it tells host paths), while
// plain /healthz does not; with the token it answers.
func TestHealthzVerbose(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := shortDir(t)
	tokFile := filepath.Join(dir, "token")
	tok := writeToken(t, tokFile)
	addr := freeAddr(t)
	noPython := filepath.Join(dir, "no", "python.wasm")
	env := []string{"XDG_RUNTIME_DIR=" + filepath.Join(dir, "run"), "ROCHE_PYTHON_WASM=" + noPython}
	socket := filepath.Join(dir, "v.sock")
	startRochedEnv(t, socket, env, "--providers", "docker,wasm", "--listen", "tcp://"+addr, "--token-file", tokFile)

	get := func(t *testing.T, hc *http.Client, url, token string) (int, doctor.Report) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r doctor.Report
		if resp.StatusCode == http.StatusOK && strings.HasSuffix(url, "?verbose") {
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, r
	}
	unix := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	code, r := get(t, unix, "http://roched/healthz?verbose", "")
	if code != http.StatusOK || r.Schema != doctor.Schema {
		t.Fatalf("/healthz?verbose on the socket: %d, schema %d", code, r.Schema)
	}
	byName := map[string]doctor.Provider{}
	for _, p := range r.Providers {
		byName[p.Name] = p
	}
	if len(byName) != 2 {
		t.Errorf("providers %+v: want docker and wasm, those served", r.Providers)
	}
	if w := byName["wasm"]; w.OK || w.Missing != "python.wasm" || w.Fix != "roche image build python --provider wasm" || !strings.Contains(w.Detail, noPython) {
		t.Errorf("wasm without python.wasm: %+v", w)
	}
	if d := byName["docker"]; !d.OK || d.Runtime != "runc" || !r.DefaultOK {
		t.Errorf("docker: %+v, default ok %v: want it to work, on runc", d, r.DefaultOK)
	}

	tcp := &http.Client{}
	if code, _ := get(t, tcp, "http://"+addr+"/healthz?verbose", ""); code != http.StatusUnauthorized {
		t.Errorf("/healthz?verbose over TCP without the token: %d, want 401", code)
	}
	if code, _ := get(t, tcp, "http://"+addr+"/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz over TCP without the token: %d, want 200", code)
	}
	if code, r := get(t, tcp, "http://"+addr+"/healthz?verbose", tok); code != http.StatusOK || len(r.Providers) != 2 {
		t.Errorf("/healthz?verbose over TCP with the token: %d, %+v", code, r.Providers)
	}
}
