package e2b_test

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/e2b"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// TestRestartKeepsSandboxes restarts roched between a create and the calls after it:
// the new roched, on the same state, knows the sandbox's template (its id, its sizes,
// the list's template filter), keeps its metadata as given, takes the same key, and
// connect hands out the same access token, which envd takes.
func TestRestartKeepsSandboxes(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	s := serve(t, daemon.Config{E2B: json.RawMessage(`{"templates": {"small": {"image": "roche/python:local", "memory": "256m"}}}`)})
	url, key := s.env["E2B_API_URL"], map[string]string{"X-API-Key": s.env["E2B_API_KEY"]}
	r := call(t, "POST", url+"/v2/sandboxes", key, `{"templateID":"small","timeout":300,"metadata":{"a":"b"}}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var created struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(r.body), &created); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.d.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// The second roched: the same socket, so the same state file and E2B secrets.
	dp, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	d, err := daemon.New(daemon.Config{Socket: s.socket, E2BListen: "tcp://127.0.0.1:0", E2B: s.cfg.E2B},
		map[string]roche.Provider{"docker": dp}, daemon.WithFrontend(e2b.New, &out))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// After the shutdown, which waits for the removals roched's destroys started.
		if err := d.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if list, err := dp.List(ctx); err == nil {
			for _, sb := range list {
				if sb.Owner == d.OwnerOf(e2b.LocalTenant) {
					t.Errorf("sandbox %s survived the test", sb.ID)
					_ = dp.Destroy(ctx, sb.ID)
				}
			}
		}
		dp.Close()
	})
	if !strings.Contains(out.String(), "export E2B_API_KEY="+s.env["E2B_API_KEY"]+"\n") {
		t.Fatalf("the restarted roched printed %q, not the first one's key", out.String())
	}
	url = "http://" + d.FrontendAddr().String()

	r = call(t, "GET", url+"/sandboxes/"+created.SandboxID, key, "")
	var info struct {
		TemplateID string
		MemoryMB   int
		Metadata   map[string]string
	}
	if err := json.Unmarshal([]byte(r.body), &info); err != nil || r.status != 200 {
		t.Fatalf("get info after the restart: %d %s", r.status, r.body)
	}
	if info.TemplateID != "small" || info.MemoryMB != 256 || !maps.Equal(info.Metadata, map[string]string{"a": "b"}) {
		t.Errorf("get info after the restart: template %q, %d MB, metadata %v; want small, 256 MB, {a: b}", info.TemplateID, info.MemoryMB, info.Metadata)
	}
	if r := call(t, "GET", url+"/v2/sandboxes?template=small", key, ""); r.status != 200 || !strings.Contains(r.body, created.SandboxID) {
		t.Errorf("list by template after the restart: %d %s", r.status, r.body)
	}
	r = call(t, "POST", url+"/v2/sandboxes/"+created.SandboxID+"/connect", key, `{"timeout":300}`)
	var connected struct{ TemplateID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(r.body), &connected); err != nil || r.status/100 != 2 {
		t.Fatalf("connect after the restart: %d %s", r.status, r.body)
	}
	if connected.TemplateID != "small" || connected.EnvdAccessToken != created.EnvdAccessToken {
		t.Errorf("connect after the restart: template %q, token %q; want small and the create's %q", connected.TemplateID, connected.EnvdAccessToken, created.EnvdAccessToken)
	}
	h := map[string]string{"E2b-Sandbox-Id": created.SandboxID, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json", "X-Access-Token": created.EnvdAccessToken}
	if r := call(t, "POST", url+"/filesystem.Filesystem/Stat", h, `{"path":"/etc/hostname"}`); r.status != 200 || !strings.Contains(r.body, "hostname") {
		t.Errorf("envd Stat after the restart: %d %s", r.status, r.body)
	}
	// A key of the listener's own in the metadata is refused, not overwritten.
	e2bError(t, "metadata naming the template's key", call(t, "POST", url+"/v2/sandboxes", key, `{"templateID":"base","metadata":{"e2b.template":"x"}}`), 400)
	if r := call(t, "DELETE", url+"/sandboxes/"+created.SandboxID, key, ""); r.status != 204 {
		t.Errorf("kill after the restart: %d %s", r.status, r.body)
	}
	e2bError(t, "get info of the killed sandbox", call(t, "GET", url+"/sandboxes/"+created.SandboxID, key, ""), 404)
}
