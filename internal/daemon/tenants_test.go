package daemon

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/wasm"
)

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func randomName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// tenantDaemon is a daemon serving TCP tenants, with its audit log kept.
type tenantDaemon struct {
	*testDaemon
	addr   string
	tokens map[string]string
	logs   *syncBuffer
}

// startTenantDaemon starts a daemon on TCP with a tenant per name (each with its own
// random token, and max_sandboxes from limits) and a JSON log.
func startTenantDaemon(t *testing.T, cfg Config, names []string, limits map[string]int, opts ...Option) *tenantDaemon {
	t.Helper()
	return startTenantDaemonOn(t, cfg, newRecorder(t), names, limits, opts...)
}

// startTenantDaemonOn is startTenantDaemon with a Docker provider of the test's making.
func startTenantDaemonOn(t *testing.T, cfg Config, rec *recorder, names []string, limits map[string]int, opts ...Option) *tenantDaemon {
	t.Helper()
	td := &tenantDaemon{tokens: map[string]string{}, logs: &syncBuffer{}}
	for _, n := range names {
		tok := randomToken()
		td.tokens[n] = tok
		cfg.Tenants = append(cfg.Tenants, Tenant{Name: n, TokenSHA256: HashToken(tok), MaxSandboxes: limits[n]})
	}
	cfg.Listen = "tcp://127.0.0.1:0"
	opts = append(opts, WithLogger(slog.New(slog.NewJSONHandler(td.logs, nil))))
	td.testDaemon = startDaemonOn(t, cfg, rec, opts...)
	td.addr = "http://" + td.d.TCPAddr().String()
	return td
}

// client is the Go client of a tenant.
func (td *tenantDaemon) client(t *testing.T, name string) *client.Provider {
	t.Helper()
	c, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens[name]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.Provider("docker")
}

// rpc is a raw API client of a tenant, for the codes the Go client smooths over.
func (td *tenantDaemon) rpc(name string) rochev1connect.SandboxServiceClient {
	hc := &http.Client{Transport: bearerTransport{token: td.tokens[name]}}
	return rochev1connect.NewSandboxServiceClient(hc, td.addr)
}

type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// auditLines returns the audit lines logged so far.
func (td *tenantDaemon) auditLines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(td.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if m["msg"] == "audit" {
			out = append(out, m)
		}
	}
	return out
}

// hasAudit reports whether an audit line has every attribute given.
func hasAudit(lines []map[string]any, want map[string]any) bool {
	return slices.ContainsFunc(lines, func(m map[string]any) bool {
		for k, v := range want {
			got, _ := json.Marshal(m[k])
			exp, _ := json.Marshal(v)
			if string(got) != string(exp) {
				return false
			}
		}
		return true
	})
}

// leftovers removes, at the end of the test, the named workspaces and snapshots from the
// engine if the test did not get to.
func leftovers(t *testing.T, workspaces, snapshots []string) {
	t.Helper()
	t.Cleanup(func() {
		dp, err := docker.New()
		if err != nil {
			t.Error(err)
			return
		}
		defer dp.Close()
		ctx := context.Background()
		for _, w := range workspaces {
			if err := dp.RemoveWorkspace(ctx, w); err == nil {
				t.Errorf("workspace %s was left behind", w)
			}
		}
		for _, s := range snapshots {
			if err := dp.RemoveSnapshot(ctx, s); err == nil {
				t.Errorf("snapshot %s was left behind", s)
			}
		}
	})
}

func ids(list []roche.SandboxInfo) []string {
	var out []string
	for _, sb := range list {
		out = append(out, sb.ID)
	}
	return out
}

// TestTenantsSeeOnlyTheirOwn: two tenants on one daemon, each with a sandbox and a
// workspace of the same name. Neither can list, inspect, exec in, stream from, pause,
// reset, snapshot, copy to or from, destroy or collect the other's sandbox: every call
// gets NOT_FOUND with the very message a made-up id gets, so ids do not leak. Their
// workspaces of one name are two, and so are their snapshots; the unix socket's tenant
// sees none of it. Every create, exec, copy and destroy leaves an audit line with the
// tenant, the sandbox and the argv or path.
func TestTenantsSeeOnlyTheirOwn(t *testing.T) {
	ws, snap := randomName("ws-"), randomName("snap-")
	// Registered first, so it runs last, once the daemon has removed the sandboxes: a
	// failure midway leaves no workspace or snapshot behind.
	leftovers(t, []string{"acme--" + ws, "bolt--" + ws}, []string{"acme--" + snap})
	td := startTenantDaemon(t, Config{}, []string{"acme", "bolt"}, nil)
	ctx := ctxFor(t, 4*time.Minute)
	acme, bolt := td.client(t, "acme"), td.client(t, "bolt")
	cfg := pyConfig()
	cfg.Workspace = ws
	a, err := acme.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bolt.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(a.Owner, "/acme") || !strings.HasSuffix(b.Owner, "/bolt") {
		t.Fatalf("owners %q and %q: want each tenant's", a.Owner, b.Owner)
	}

	// One workspace name, two workspaces.
	if res, err := acme.Exec(ctx, a.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo from-acme > /workspace/f"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing acme's workspace: %+v %v", res, err)
	}
	if res, err := bolt.Exec(ctx, b.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "ls -A /workspace"}}); err != nil || res.ExitCode != 0 || res.Stdout != "" {
		t.Fatalf("bolt's workspace %s shows %q (%v): it must be its own, empty", ws, res.Stdout, err)
	}

	for name, p := range map[string]*client.Provider{"acme": acme, "bolt": bolt, "local": td.p} {
		list, err := p.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]string{"acme": {a.ID}, "bolt": {b.ID}}[name]
		if !slices.Equal(ids(list), want) {
			t.Errorf("tenant %s lists %v, want %v", name, ids(list), want)
		}
	}

	// Every call on acme's sandbox from bolt is answered as for a made-up id.
	ghost := strings.Repeat("f", 64)
	rpc := td.rpc("bolt")
	tmp := t.TempDir()
	os.WriteFile(filepath.Join(tmp, "in"), []byte("x"), 0o644)
	calls := map[string]func(id string) error{
		"inspect": func(id string) error { _, err := bolt.Inspect(ctx, id); return err },
		"inspect by prefix": func(id string) error {
			_, err := bolt.Inspect(ctx, id[:12])
			return err
		},
		"exec": func(id string) error {
			_, err := rpc.Exec(ctx, connect.NewRequest(&rochev1.ExecRequest{SandboxId: id, Cmd: []string{"cat", "/workspace/f"}}))
			return err
		},
		"exec stream": func(id string) error {
			s, err := rpc.ExecStream(ctx, connect.NewRequest(&rochev1.ExecStreamRequest{SandboxId: id, Cmd: []string{"true"}}))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		},
		"destroy": func(id string) error {
			_, err := rpc.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{id}}))
			return err
		},
		"pause":    func(id string) error { return bolt.Pause(ctx, id) },
		"unpause":  func(id string) error { return bolt.Unpause(ctx, id) },
		"reset":    func(id string) error { _, err := bolt.Reset(ctx, id, true); return err },
		"snapshot": func(id string) error { _, err := bolt.Snapshot(ctx, id, "stolen"); return err },
		"copy to":  func(id string) error { return bolt.CopyTo(ctx, id, filepath.Join(tmp, "in"), "/tmp/in") },
		"copy from": func(id string) error {
			return bolt.CopyFrom(ctx, id, "/workspace/f", filepath.Join(tmp, "out-"+id[:4]))
		},
	}
	for name, call := range calls {
		errOther, errGhost := call(a.ID), call(ghost)
		if connectCode(errOther) != connect.CodeNotFound || connectCode(errGhost) != connect.CodeNotFound {
			t.Errorf("%s on another tenant's sandbox: %v; on a made-up id: %v; want NOT_FOUND for both", name, errOther, errGhost)
			continue
		}
		other := strings.ReplaceAll(strings.ReplaceAll(errOther.Error(), a.ID, ghost), a.ID[:12], ghost[:12])
		if other != errGhost.Error() {
			t.Errorf("%s: another tenant's sandbox gets %q, a made-up id %q: the difference leaks it", name, errOther, errGhost)
		}
	}
	// The Go client's Destroy is idempotent, so it says nothing, and does nothing.
	if err := bolt.Destroy(ctx, a.ID); err != nil {
		t.Errorf("bolt destroying acme's sandbox through the client: %v, want nil (nothing to do)", err)
	}
	if _, err := bolt.GC(ctx, roche.GCOptions{All: true}); err != nil {
		t.Fatal(err)
	}
	if res, err := acme.Exec(ctx, a.ID, roche.ExecRequest{Cmd: []string{"cat", "/workspace/f"}}); err != nil || res.Stdout != "from-acme\n" {
		t.Fatalf("acme's sandbox after bolt's attempts: %+v %v", res, err)
	}
	if !td.gone(b.ID) {
		eventually(t, 30*time.Second, "bolt's gc --all to take its own sandbox", func() bool { return td.gone(b.ID) })
	}

	// Workspaces: each tenant sees its own under the name it gave; the socket's tenant
	// sees neither, nor anything namespaced.
	for name, p := range map[string]*client.Provider{"acme": acme, "bolt": bolt, "local": td.p} {
		wss, err := p.Workspaces(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, w := range wss {
			if w.Name == ws {
				n++
			}
			if strings.Contains(w.Name, "--") {
				t.Errorf("tenant %s sees a namespaced workspace %s", name, w.Name)
			}
		}
		if want := map[string]int{"acme": 1, "bolt": 1}[name]; n != want {
			t.Errorf("tenant %s sees workspace %s %d times, want %d", name, ws, n, want)
		}
	}
	if err := bolt.RemoveWorkspace(ctx, ws); err != nil {
		t.Fatalf("bolt removing its workspace: %v", err)
	}
	if wss, _ := acme.Workspaces(ctx); !slices.ContainsFunc(wss, func(w roche.Workspace) bool { return w.Name == ws }) {
		t.Fatal("bolt's removal took acme's workspace")
	}

	// Snapshots: acme's is acme's alone.
	if sn, err := acme.Snapshot(ctx, a.ID, snap); err != nil || sn.Name != snap {
		t.Fatalf("acme's snapshot: %+v %v", sn, err)
	}
	if sns, _ := bolt.Snapshots(ctx); slices.ContainsFunc(sns, func(s roche.Snapshot) bool { return s.Name == snap }) {
		t.Error("bolt lists acme's snapshot")
	}
	from := pyConfig()
	from.FromSnapshot = snap
	if sb, err := bolt.Create(ctx, from); connectCode(err) != connect.CodeNotFound {
		if err == nil {
			bolt.Destroy(ctx, sb.ID)
		}
		t.Errorf("bolt creating from acme's snapshot: %v, want NOT_FOUND", err)
	}
	if err := bolt.RemoveSnapshot(ctx, snap); connectCode(err) != connect.CodeNotFound {
		t.Errorf("bolt removing acme's snapshot: %v, want NOT_FOUND", err)
	}
	if err := bolt.RemoveWorkspace(ctx, ws); connectCode(err) != connect.CodeNotFound {
		t.Errorf("bolt removing acme's workspace (its own is gone): %v, want NOT_FOUND", err)
	}

	if err := acme.CopyTo(ctx, a.ID, filepath.Join(tmp, "in"), "/tmp/in"); err != nil {
		t.Fatal(err)
	}
	if err := acme.CopyFrom(ctx, a.ID, "/tmp/in", filepath.Join(tmp, "back")); err != nil {
		t.Fatal(err)
	}
	if err := acme.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "acme's sandbox to go", func() bool { return td.gone(a.ID) })
	if err := acme.RemoveSnapshot(ctx, snap); err != nil {
		t.Error(err)
	}
	if err := acme.RemoveWorkspace(ctx, ws); err != nil {
		t.Error(err)
	}

	lines := td.auditLines(t)
	for _, want := range []map[string]any{
		{"op": "create", "tenant": "acme", "id": a.ID, "ok": true},
		{"op": "exec", "tenant": "acme", "id": a.ID, "argv": []string{"sh", "-c", "echo from-acme > /workspace/f"}, "ok": true},
		{"op": "exec", "tenant": "bolt", "id": a.ID, "argv": []string{"cat", "/workspace/f"}, "ok": false},
		{"op": "copy_to", "tenant": "acme", "id": a.ID, "dst": "/tmp/in", "ok": true},
		{"op": "copy_from", "tenant": "acme", "id": a.ID, "src": "/tmp/in", "ok": true},
		{"op": "copy_from", "tenant": "bolt", "id": a.ID, "src": "/workspace/f", "ok": false},
		{"op": "destroy", "tenant": "bolt", "id": a.ID, "ok": false},
		{"op": "destroy", "tenant": "bolt", "id": b.ID, "by": "gc", "ok": true},
		{"op": "destroy", "tenant": "acme", "id": a.ID, "ok": true},
	} {
		if !hasAudit(lines, want) {
			t.Errorf("no audit line %v in:\n%s", want, td.logs)
		}
	}
}

// TestTenantMaxSandboxes: a tenant's max_sandboxes bounds its own sandboxes, within the
// daemon's bound, and leaves other tenants alone.
func TestTenantMaxSandboxes(t *testing.T) {
	td := startTenantDaemon(t, Config{MaxSandboxes: 3}, []string{"acme", "bolt"}, map[string]int{"acme": 1})
	ctx := ctxFor(t, 2*time.Minute)
	acme, bolt := td.client(t, "acme"), td.client(t, "bolt")
	a, err := acme.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	if sb, err := acme.Create(ctx, pyConfig()); !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "tenant acme is at its limit of 1") {
		if err == nil {
			acme.Destroy(ctx, sb.ID)
		}
		t.Fatalf("acme's second sandbox: %v, want RESOURCE_EXHAUSTED for the tenant", err)
	}
	var made []string
	for range 2 {
		sb, err := bolt.Create(ctx, pyConfig())
		if err != nil {
			t.Fatalf("bolt, under no tenant limit: %v", err)
		}
		made = append(made, sb.ID)
	}
	if _, err := bolt.Create(ctx, pyConfig()); !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "--max-sandboxes") {
		t.Fatalf("bolt beyond the daemon's bound: %v", err)
	}
	// The socket's tenant cannot free room by destroying acme's sandbox either.
	if _, err := td.c.DestroyAll(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := acme.Inspect(ctx, a.ID); err != nil {
		t.Fatalf("acme's sandbox after the socket's destroy --all: %v", err)
	}
	if err := acme.Destroy(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if sb, err := acme.Create(ctx, pyConfig()); err != nil {
		t.Fatalf("acme after destroying its sandbox: %v", err)
	} else {
		acme.Destroy(ctx, sb.ID)
	}
	for _, id := range made {
		bolt.Destroy(ctx, id)
	}
}

// TestRootSandboxesRefused: without --allow-root-sandboxes no tenant, local or remote,
// gets a sandbox whose commands run as root (uid or gid 0, or a name the image decides);
// with it, they do.
func TestRootSandboxesRefused(t *testing.T) {
	td := startTenantDaemon(t, Config{}, []string{"acme"}, nil)
	ctx := ctxFor(t, 2*time.Minute)
	for _, user := range []string{"0", "0:0", "root", "root:root", "65534:0", "0:65534", "nobody", " 0"} {
		for name, p := range map[string]*client.Provider{"local": td.p, "acme": td.client(t, "acme")} {
			cfg := pyConfig()
			cfg.User = user
			sb, err := p.Create(ctx, cfg)
			if connectCode(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "--allow-root-sandboxes") {
				if err == nil {
					p.Destroy(ctx, sb.ID)
				}
				t.Errorf("tenant %s, user %q: %v, want PERMISSION_DENIED naming --allow-root-sandboxes", name, user, err)
			}
		}
	}
	if n := len(td.rec.ids()); n != 0 {
		t.Fatalf("refused creates made %d sandboxes", n)
	}
	// The default, a uid drawn for the sandbox, is never root.
	auto := pyConfig()
	auto.User = roche.UserAuto
	acme := td.client(t, "acme")
	sb, err := acme.Create(ctx, auto)
	if err != nil {
		t.Fatalf("user %q: %v", roche.UserAuto, err)
	}
	res, err := acme.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"id", "-u"}})
	acme.Destroy(ctx, sb.ID)
	if err != nil || res.Stdout == "0\n" || res.ExitCode != 0 {
		t.Fatalf("user %q runs as %q (%v)", roche.UserAuto, res.Stdout, err)
	}

	allowed := startDaemon(t, Config{AllowRootSandboxes: true})
	cfg := pyConfig()
	cfg.User = "0:0"
	sb, err = allowed.p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer allowed.p.Destroy(ctx, sb.ID)
	if res, err := allowed.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"id", "-u"}}); err != nil || res.Stdout != "0\n" {
		t.Fatalf("with --allow-root-sandboxes: %+v %v", res, err)
	}
}

// TestPoolsAreTheOperators: TCP tenants cannot drain or warm up the pools every tenant
// shares; the unix socket's tenant can.
func TestPoolsAreTheOperators(t *testing.T) {
	td := startTenantDaemon(t, Config{}, []string{"acme"}, nil)
	ctx := ctxFor(t, time.Minute)
	c, err := client.New(client.WithAddress(td.addr), client.WithToken(td.tokens["acme"]))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, err := c.PoolDrain(ctx, ""); connectCode(err) != connect.CodePermissionDenied {
		t.Errorf("a tenant draining the pools: %v, want PERMISSION_DENIED", err)
	}
	if _, err := c.PoolWarmup(ctx, "", 1); connectCode(err) != connect.CodePermissionDenied {
		t.Errorf("a tenant warming the pools up: %v, want PERMISSION_DENIED", err)
	}
	if _, _, err := td.c.PoolDrain(ctx, ""); err != nil {
		t.Errorf("the operator draining the pools: %v", err)
	}
}

// TestTenantMounts: a TCP tenant mounts host paths only at or below its mount roots,
// by canonical path; a daemon whose provider does not pin mounts refuses them; the unix
// socket's tenant mounts anywhere. Then the attack: with a read-write mount of a
// directory below the root, the tenant's code swaps a directory it made there and a
// symbolic link to a victim directory (RENAME_EXCHANGE, as fast as it can) while the
// tenant creates sandboxes mounting that directory. Each create is refused or binds the
// real directory; the victim's file is never seen.
func TestTenantMounts(t *testing.T) {
	base := shortDir(t)
	root := filepath.Join(base, "allowed")
	shared := filepath.Join(root, "shared")
	victim := filepath.Join(base, "victim")
	for _, d := range []string{shared, victim} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(shared, 0o777) // the sandbox user writes here
	os.WriteFile(filepath.Join(victim, "marker"), []byte("victim"), 0o644)
	os.Symlink(victim, filepath.Join(root, "link"))
	real := filepath.Join(root, "real")
	os.Mkdir(real, 0o755)
	os.WriteFile(filepath.Join(real, "marker"), []byte("real"), 0o644)

	rec := newRecorder(t, docker.WithPinnedMounts(), docker.WithStateDir(filepath.Join(base, "state")))
	td := startTenantDaemonOn(t, Config{AllowMountRoots: []string{root}}, rec, []string{"acme"}, nil)
	t.Cleanup(func() { unmountPins(filepath.Join(base, "state")) })
	ctx := ctxFor(t, 8*time.Minute)
	acme := td.client(t, "acme")
	mountCfg := func(src, target string, rw bool) roche.Config {
		cfg := pyConfig()
		cfg.Mounts = []roche.Mount{{Source: src, Target: target, ReadWrite: rw}}
		return cfg
	}
	refused := []struct {
		src  string
		code connect.Code
		says string
	}{
		{victim, connect.CodePermissionDenied, "is not at or below a directory tenant acme may mount"},
		{"/etc", connect.CodePermissionDenied, "is not at or below"},
		{root + "/../victim", connect.CodePermissionDenied, "is not at or below"},
		{root + "/real/", connect.CodePermissionDenied, "is not at or below"},
		{filepath.Join(root, "link"), connect.CodeInvalidArgument, "goes through a symbolic link"},
		{filepath.Join(root, "none"), connect.CodeInvalidArgument, "no such file"},
	}
	for _, c := range refused {
		sb, err := acme.Create(ctx, mountCfg(c.src, "/m", false))
		if connectCode(err) != c.code || !strings.Contains(err.Error(), c.says) {
			if err == nil {
				acme.Destroy(ctx, sb.ID)
			}
			t.Errorf("mount %s: %v, want %v saying %q", c.src, err, c.code, c.says)
		}
	}
	sb, err := acme.Create(ctx, mountCfg(real, "/m", false))
	if err != nil {
		t.Fatalf("a mount below the root: %v", err)
	}
	if res, err := acme.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"cat", "/m/marker"}}); err != nil || res.Stdout != "real" {
		t.Fatalf("the allowed mount shows %+v %v", res, err)
	}
	acme.Destroy(ctx, sb.ID)
	// The socket's tenant may mount anywhere, through its own links too.
	sb, err = td.p.Create(ctx, mountCfg(filepath.Join(root, "link"), "/m", false))
	if err != nil {
		t.Fatalf("the local tenant's mount: %v", err)
	}
	if res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"cat", "/m/marker"}}); err != nil || res.Stdout != "victim" {
		t.Fatalf("the local tenant's mount shows %+v %v", res, err)
	}
	td.p.Destroy(ctx, sb.ID)

	// The race. The swapper runs in a sandbox with the shared directory mounted rw.
	swapperSb, err := acme.Create(ctx, mountCfg(shared, "/w", true))
	if err != nil {
		t.Fatal(err)
	}
	swapper := `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.mkdir('/w/x')
with open('/w/x/marker', 'w') as f:
    f.write('real')
os.symlink(sys.argv[1], '/w/x.swap')
def swap():
    if libc.renameat2(-100, b'/w/x', -100, b'/w/x.swap', 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        print('renameat2 failed', ctypes.get_errno()); sys.exit(1)
n = 0
while not os.path.exists('/w/stop'):
    # The link stands a quarter of the time (busy waits: a sleep is too coarse), so a
    # check that saw the directory is often followed by a bind that would meet the link,
    # were the bind by path.
    swap()
    for _ in range(100): pass
    swap()
    for _ in range(300): pass
    n += 2
print(n)
`
	type outcome struct {
		res roche.ExecResult
		err error
	}
	swapping := make(chan outcome, 1)
	go func() {
		res, err := acme.Exec(ctx, swapperSb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", swapper, victim}, Timeout: 5 * time.Minute})
		swapping <- outcome{res, err}
	}()
	x := filepath.Join(shared, "x")
	// swapped waits until the host has seen x as the link and then as the directory
	// again: the swapper is swapping now, whatever the machine's load did to it.
	swapped := func() {
		t.Helper()
		sawLink := false
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(50 * time.Microsecond) {
			fi, err := os.Lstat(x)
			switch {
			case err != nil:
			case fi.Mode()&os.ModeSymlink != 0:
				sawLink = true
			case sawLink && fi.IsDir():
				return
			}
		}
		select {
		case out := <-swapping:
			t.Fatalf("the swapper ended: %+v %v", out.res, out.err)
		default:
			t.Fatalf("the swapper made no full swap within a minute (link seen: %v)", sawLink)
		}
	}
	// Each create starts right after a full swap, so that the swapper runs through it
	// (under load a stalled swapper would leave every create one state), and creates
	// go on until some were served and some refused: the creates met both states, the
	// served ones with the link coming and going around their check and bind. Bounded
	// in rounds and time.
	served, refusedN, rounds := 0, 0, 0
	for end := time.Now().Add(3 * time.Minute); rounds < 400 && time.Now().Before(end) && (rounds < 8 || served < 4 || refusedN == 0); rounds++ {
		swapped()
		sb, err := acme.Create(ctx, mountCfg(x, "/v", false))
		if err != nil {
			if connectCode(err) != connect.CodeInvalidArgument {
				t.Fatalf("create during the swaps: %v, want success or INVALID_ARGUMENT", err)
			}
			refusedN++
			continue
		}
		res, err := acme.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"cat", "/v/marker"}})
		acme.Destroy(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(res.Stdout, "victim") {
			t.Fatalf("a sandbox mounted the victim directory through the swapped link: %+v", res)
		}
		if res.Stdout != "real" {
			t.Fatalf("the mount shows %q (%s), want the real directory's marker", res.Stdout, res.Stderr)
		}
		served++
	}
	os.WriteFile(filepath.Join(shared, "stop"), nil, 0o644)
	out := <-swapping
	if out.err != nil || out.res.ExitCode != 0 {
		t.Fatalf("the swapper: %+v %v", out.res, out.err)
	}
	flips, _ := strconv.Atoi(strings.TrimSpace(out.res.Stdout))
	t.Logf("%d creates bound the real directory, %d were refused, in %d rounds during %d swaps", served, refusedN, rounds, flips)
	if served == 0 || refusedN == 0 || flips < 2*rounds {
		t.Fatalf("the race was not exercised: %d served, %d refused, %d swaps in %d rounds", served, refusedN, flips, rounds)
	}
	acme.Destroy(ctx, swapperSb.ID)

	// Without a pinning provider, remote tenants' mounts are refused outright.
	plain := startTenantDaemon(t, Config{AllowMountRoots: []string{root}}, []string{"acme"}, nil)
	if sb, err := plain.client(t, "acme").Create(ctx, mountCfg(real, "/m", false)); connectCode(err) != connect.CodeUnimplemented || !strings.Contains(err.Error(), "pins") {
		if err == nil {
			plain.client(t, "acme").Destroy(ctx, sb.ID)
		}
		t.Fatalf("a remote mount through a provider that does not pin: %v, want UNIMPLEMENTED", err)
	}
	// And a tenant without mount roots mounts nothing.
	none := startTenantDaemon(t, Config{}, []string{"acme"}, nil)
	if _, err := none.client(t, "acme").Create(ctx, mountCfg(real, "/m", false)); connectCode(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "--allow-mount-root") {
		t.Fatalf("a mount from a tenant without roots: %v, want PERMISSION_DENIED naming --allow-mount-root", err)
	}
}

// unmountPins detaches staging points a failed test may have left under a Docker
// state directory, before its removal (which must never recurse into a mount).
func unmountPins(stateDir string) {
	pinned := filepath.Join(stateDir, "pinned")
	entries, _ := os.ReadDir(pinned)
	for _, e := range entries {
		syscall.Unmount(filepath.Join(pinned, e.Name()), syscall.MNT_DETACH)
	}
	syscall.Unmount(pinned, syscall.MNT_DETACH)
}

// TestTenantsOnWasm: the same boundaries with the wasm provider: one tenant cannot reach
// another's wasm sandbox, a workspace name is each tenant's own, and host mounts from a
// TCP tenant are refused, since wasm opens mount paths by name at every exec.
func TestTenantsOnWasm(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	dir := shortDir(t)
	wp, err := wasm.New(wasm.WithStateDir(filepath.Join(dir, "wasm")))
	if err != nil {
		t.Fatal(err)
	}
	defer wp.Close()
	if err := wp.Available(); err != nil {
		t.Fatal(err)
	}
	toks := map[string]string{"acme": randomToken(), "bolt": randomToken()}
	cfg := Config{Socket: filepath.Join(dir, "r.sock"), Listen: "tcp://127.0.0.1:0", AllowMountRoots: []string{dir}}
	for n, tok := range toks {
		cfg.Tenants = append(cfg.Tenants, Tenant{Name: n, TokenSHA256: HashToken(tok)})
	}
	d, err := New(cfg, map[string]roche.Provider{"wasm": wp})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 2*time.Minute)
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		if left := wasmSandboxes(t, filepath.Join(dir, "wasm")); len(left) > 0 {
			t.Errorf("wasm sandboxes left after shutdown: %v", left)
		}
	}()
	tenant := func(n string) *client.Provider {
		c, err := client.New(client.WithAddress("http://"+d.TCPAddr().String()), client.WithToken(toks[n]))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.Provider("wasm")
	}
	acme, bolt := tenant("acme"), tenant("bolt")
	wcfg := roche.DefaultConfig()
	wcfg.Image = "python:3.12"
	wcfg.Workspace = "notes"
	a, err := acme.Create(ctx, wcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer acme.Destroy(ctx, a.ID)
	b, err := bolt.Create(ctx, wcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Destroy(ctx, b.ID)
	write := "open('/workspace/f', 'w').write('from acme')"
	if res, err := acme.Exec(ctx, a.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", write}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("acme writing its workspace: %+v %v", res, err)
	}
	if res, err := bolt.Exec(ctx, b.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "import os; print(os.listdir('/workspace'))"}}); err != nil || res.Stdout != "[]\n" {
		t.Fatalf("bolt's workspace notes shows %+v %v: it must be its own", res, err)
	}
	if _, err := bolt.Exec(ctx, a.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(1)"}}); connectCode(err) != connect.CodeNotFound {
		t.Errorf("bolt exec in acme's wasm sandbox: %v, want NOT_FOUND", err)
	}
	if _, err := bolt.Inspect(ctx, a.ID); connectCode(err) != connect.CodeNotFound {
		t.Errorf("bolt inspect of acme's wasm sandbox: %v, want NOT_FOUND", err)
	}
	if list, _ := bolt.List(ctx); !slices.Equal(ids(list), []string{b.ID}) {
		t.Errorf("bolt lists %v, want only %s", ids(list), b.ID)
	}
	mcfg := roche.DefaultConfig()
	mcfg.Image = "python:3.12"
	mcfg.Mounts = []roche.Mount{{Source: dir, Target: "/data"}}
	if sb, err := acme.Create(ctx, mcfg); connectCode(err) != connect.CodeUnimplemented {
		if err == nil {
			acme.Destroy(ctx, sb.ID)
		}
		t.Errorf("a remote tenant's host mount on wasm: %v, want UNIMPLEMENTED", err)
	}
	wss, err := acme.Workspaces(ctx)
	if err != nil || len(wss) != 1 || wss[0].Name != "notes" {
		t.Errorf("acme's workspaces %+v %v, want notes alone", wss, err)
	}
}
