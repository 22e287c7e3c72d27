package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/pool"
)

// postJSON calls a method the way curl would: plain HTTP, a JSON body.
func postJSON(t *testing.T, hc *http.Client, base, method, body string) (int, map[string]any) {
	t.Helper()
	resp, err := hc.Post(base+"/roche.v1.SandboxService/"+method, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: response %q is not JSON: %v", method, b, err)
	}
	return resp.StatusCode, out
}

// TestConnectJSON: Create, Exec and Destroy with plain HTTP and JSON, as curl would.
func TestConnectJSON(t *testing.T) {
	td := startDaemon(t, Config{})
	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()

	code, out := postJSON(t, hc, "http://roched", "Create", `{"config": {"image": "`+testImage()+`", "env": {"WHO": "curl"}}}`)
	if code != 200 {
		t.Fatalf("Create: HTTP %d %v", code, out)
	}
	sb, _ := out["sandbox"].(map[string]any)
	id, _ := sb["id"].(string)
	if id == "" || sb["state"] != "SANDBOX_STATE_RUNNING" || sb["expiresAt"] == nil {
		t.Fatalf("Create answered %v", out)
	}

	code, out = postJSON(t, hc, "http://roched", "Exec", `{"sandboxId": "`+id+`", "cmd": ["sh", "-c", "echo hello $WHO"]}`)
	res, _ := out["result"].(map[string]any)
	if code != 200 || res["stdout"] != "aGVsbG8gY3VybAo=" { // base64 of "hello curl\n": output is bytes
		t.Fatalf("Exec: HTTP %d %v", code, out)
	}

	// Fields given are used as given: a zero cpus is refused, not defaulted.
	code, out = postJSON(t, hc, "http://roched", "Create", `{"config": {"image": "`+testImage()+`", "cpus": 0}}`)
	if code != 400 || out["code"] != "invalid_argument" || !strings.Contains(out["message"].(string), "cpus is 0") {
		t.Fatalf("zero cpus: HTTP %d %v", code, out)
	}

	// Errors come back as Connect's JSON error with the core's message.
	code, out = postJSON(t, hc, "http://roched", "Exec", `{"sandboxId": "0123456789abcdef", "cmd": ["true"]}`)
	if code != 404 || out["code"] != "not_found" || !strings.Contains(out["message"].(string), "no sandbox 0123456789abcdef") {
		t.Fatalf("unknown sandbox: HTTP %d %v", code, out)
	}

	code, out = postJSON(t, hc, "http://roched", "Destroy", `{"ids": ["`+id+`"]}`)
	if code != 200 {
		t.Fatalf("Destroy: HTTP %d %v", code, out)
	}
	eventually(t, 30*time.Second, "the destroyed sandbox to be removed", func() bool { return td.gone(id) })

	// The same handler speaks gRPC-Web.
	web := rochev1connect.NewSandboxServiceClient(hc, "http://roched", connect.WithGRPCWeb())
	pr, err := web.ListProviders(context.Background(), connect.NewRequest(&rochev1.ListProvidersRequest{}))
	if err != nil || len(pr.Msg.Providers) != 1 || !pr.Msg.Providers[0].Capabilities.Processes ||
		!strings.HasPrefix(pr.Header().Get("Content-Type"), "application/grpc-web") {
		t.Fatalf("gRPC-Web ListProviders: %v %v", pr, err)
	}

	// /healthz and /metrics answer plain GETs.
	resp, err := hc.Get("http://roched/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h client.Health
	_ = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if h.Status != "ok" || len(h.Providers) != 1 || h.Providers[0] != "docker" {
		t.Fatalf("/healthz: %+v", h)
	}
}

// grpcClient speaks gRPC over cleartext HTTP/2 on the unix socket.
func grpcClient(socket string) (rochev1connect.SandboxServiceClient, *http.Transport) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	return rochev1connect.NewSandboxServiceClient(&http.Client{Transport: tr}, "http://roched", connect.WithGRPC()), tr
}

// TestGRPCExecStream: output arrives in order as it is produced, heartbeats fill the
// quiet, and the result comes last.
func TestGRPCExecStream(t *testing.T) {
	td := startDaemon(t, Config{HeartbeatInterval: 150 * time.Millisecond})
	rpc, tr := grpcClient(td.socket)
	defer tr.CloseIdleConnections()
	ctx := ctxFor(t, 2*time.Minute)

	cresp, err := rpc.Create(ctx, connect.NewRequest(&rochev1.CreateRequest{Config: &rochev1.SandboxConfig{Image: proto.String(testImage())}}))
	if err != nil {
		t.Fatal(err)
	}
	id := cresp.Msg.Sandbox.Id
	stream, err := rpc.ExecStream(ctx, connect.NewRequest(&rochev1.ExecStreamRequest{
		SandboxId: id,
		Cmd: []string{"python3", "-c",
			"import sys, time\nprint('one', flush=True)\ntime.sleep(0.8)\nsys.stderr.write('two\\n'); sys.stderr.flush()\nprint('three', flush=True)\nsys.exit(3)"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	var stdout, stderr bytes.Buffer
	var result *rochev1.ExecResult
	for stream.Receive() {
		if result != nil {
			t.Fatal("an event after the result")
		}
		switch ev := stream.Msg().Event.(type) {
		case *rochev1.ExecStreamResponse_Output:
			if ev.Output.Stream == rochev1.OutputStream_OUTPUT_STREAM_STDERR {
				stderr.Write(ev.Output.Data)
			} else {
				stdout.Write(ev.Output.Data)
			}
			events = append(events, "output")
		case *rochev1.ExecStreamResponse_Heartbeat:
			events = append(events, "heartbeat")
		case *rochev1.ExecStreamResponse_Result:
			result = ev.Result
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if stream.ResponseHeader().Get("Content-Type") != "application/grpc" {
		t.Fatalf("response content type %q: not gRPC", stream.ResponseHeader().Get("Content-Type"))
	}
	if result == nil || result.ExitCode != 3 || stdout.String() != "one\nthree\n" || stderr.String() != "two\n" {
		t.Fatalf("result %v, stdout %q, stderr %q", result, stdout.String(), stderr.String())
	}
	// Heartbeats may come before the first line too (python3 can take longer than one
	// interval to start on a loaded machine); what matters is the pause: the first line
	// arrives before it, and heartbeats keep the stream alive during it.
	joined := strings.Join(events, ",")
	if !strings.Contains(joined, "output,heartbeat") {
		t.Fatalf("events %s: want the first line before the pause and heartbeats during it", joined)
	}
	if _, err := rpc.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{id}})); err != nil {
		t.Fatal(err)
	}
}

// TestErrorCodes: bad requests get the right RPC code, the core's message, and errors
// the Go client turns back into the core's sentinels.
func TestErrorCodes(t *testing.T) {
	td := startDaemon(t, Config{})
	ctx := ctxFor(t, 2*time.Minute)
	rpc, tr := grpcClient(td.socket)
	defer tr.CloseIdleConnections()

	bad := func(mod func(*roche.Config)) *rochev1.CreateRequest {
		cfg := pyConfig()
		mod(&cfg)
		return &rochev1.CreateRequest{Config: &rochev1.SandboxConfig{
			Image: &cfg.Image, Memory: &cfg.Memory, TimeoutSecs: proto.Int32(int32(cfg.TimeoutSecs)), Workdir: cfg.Workdir,
		}}
	}
	cases := []struct {
		name    string
		call    func() error
		code    connect.Code
		message string
	}{
		{"exec unknown sandbox", func() error {
			_, err := rpc.Exec(ctx, connect.NewRequest(&rochev1.ExecRequest{SandboxId: "0123456789abcdef", Cmd: []string{"true"}}))
			return err
		}, connect.CodeNotFound, "no sandbox 0123456789abcdef"},
		{"inspect unknown sandbox", func() error {
			_, err := rpc.Inspect(ctx, connect.NewRequest(&rochev1.InspectRequest{SandboxId: "0123456789abcdef"}))
			return err
		}, connect.CodeNotFound, "listing your sandboxes shows the live ones"},
		{"bad memory", func() error {
			_, err := rpc.Create(ctx, connect.NewRequest(bad(func(c *roche.Config) { c.Memory = "512x" })))
			return err
		}, connect.CodeInvalidArgument, `"512x" is not a size`},
		{"every problem at once", func() error {
			_, err := rpc.Create(ctx, connect.NewRequest(bad(func(c *roche.Config) { c.Memory = "lots"; c.TimeoutSecs = -5; c.Workdir = "rel" })))
			return err
		}, connect.CodeInvalidArgument, "positive number of seconds"},
		{"unknown provider", func() error {
			_, err := rpc.Create(ctx, connect.NewRequest(&rochev1.CreateRequest{Provider: "vmware"}))
			return err
		}, connect.CodeInvalidArgument, `unknown provider "vmware": this daemon serves docker`},
		{"image missing", func() error {
			_, err := rpc.Create(ctx, connect.NewRequest(&rochev1.CreateRequest{Config: &rochev1.SandboxConfig{Image: proto.String("roche/no-such-image:none")}}))
			return err
			// Worded for an API caller: made on roched's host, then the image to ask for.
		}, connect.CodeFailedPrecondition, `make it on the host that runs the sandboxes (roched's, when you use roched) with roche image build python (as root), then create sandboxes with image "roche/python:local"`},
		{"empty command", func() error {
			_, err := rpc.Exec(ctx, connect.NewRequest(&rochev1.ExecRequest{SandboxId: "0123456789abcdef"}))
			return err
		}, connect.CodeInvalidArgument, "empty command"},
		{"negative exec timeout", func() error {
			_, err := rpc.Exec(ctx, connect.NewRequest(&rochev1.ExecRequest{SandboxId: "x", Cmd: []string{"true"}, TimeoutSecs: -1}))
			return err
		}, connect.CodeInvalidArgument, "timeout_secs -1"},
		{"destroy neither ids nor all", func() error {
			_, err := rpc.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{}))
			return err
		}, connect.CodeInvalidArgument, "give sandbox ids or all"},
		{"unknown pool", func() error {
			_, err := rpc.PoolDrain(ctx, connect.NewRequest(&rochev1.PoolDrainRequest{Key: "docker/none:none"}))
			return err
		}, connect.CodeNotFound, "no pool docker/none:none"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if connect.CodeOf(err) != c.code {
				t.Fatalf("code %v (%v), want %v", connect.CodeOf(err), err, c.code)
			}
			var ce *connect.Error
			if !errors.As(err, &ce) || !strings.Contains(ce.Message(), c.message) {
				t.Fatalf("message %q does not say %q", ce.Message(), c.message)
			}
		})
	}

	// Through the Go client the same failures wrap the core's sentinels.
	p := td.p
	if _, err := p.Exec(ctx, "0123456789abcdef", roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "no sandbox") {
		t.Errorf("client exec unknown: %v", err)
	}
	cfg := pyConfig()
	cfg.Memory = "512x"
	if _, err := p.Create(ctx, cfg); !errors.Is(err, roche.ErrInvalidConfig) || strings.HasPrefix(err.Error(), "invalid_argument") {
		t.Errorf("client bad memory: %v", err)
	}
	cfg = pyConfig()
	cfg.Image = "roche/no-such-image:none"
	if _, err := p.Create(ctx, cfg); !errors.Is(err, roche.ErrImageNotFound) {
		t.Errorf("client missing image: %v", err)
	}
	if n := len(td.rec.ids()); n != 0 {
		t.Errorf("bad requests made %d sandboxes", n)
	}
}

// TestPool: hits, misses, per-request env and workdir on a pooled sandbox, the real
// expiry, refill, drain, warmup, idle timeout, and the metrics that count them.
func TestPool(t *testing.T) {
	// max=1: with room for two, the pool keeps a second idle sandbox when creates are slow
	// (its demand model, pool.demand), which makes the counts below depend on load.
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=1&max=1&idle_timeout=4")
	if err != nil {
		t.Fatal(err)
	}
	td := startDaemon(t, Config{Pools: []pool.Spec{spec}})
	ctx := ctxFor(t, 2*time.Minute)
	key := spec.Key.String()

	if _, err := td.c.PoolWarmup(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	idleIDs := func() []string {
		var ids []string
		for _, r := range td.d.ledger.Records() {
			if r.Kind == ledger.KindPooled {
				ids = append(ids, r.ID)
			}
		}
		return ids
	}
	if ids := idleIDs(); len(ids) != 1 {
		t.Fatalf("after warmup: %d idle", len(ids))
	}

	// A hit: env and workdir were not known when the sandbox was made, and still apply.
	cfg := pyConfig()
	cfg.Env = map[string]string{"GREETING": "hi", "KEEP": "kept"}
	cfg.Workdir = "/tmp"
	cfg.TimeoutSecs = 120
	start := time.Now()
	sb, pooled, err := td.c.Create(ctx, "docker", cfg)
	if err != nil || !pooled {
		t.Fatalf("create: pooled %v, %v", pooled, err)
	}
	if d := sb.ExpiresAt.Sub(start); d < 119*time.Second || d > 122*time.Second {
		t.Fatalf("a pooled sandbox asked for 120 s expires in %v", d)
	}
	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", `echo "$GREETING $KEEP"; pwd`}})
	if err != nil || res.Stdout != "hi kept\n/tmp\n" {
		t.Fatalf("exec in pooled sandbox: %+v %v", res, err)
	}
	res, err = td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", `echo "$GREETING $KEEP"; pwd`},
		Env: map[string]string{"GREETING": "yo"}, Workdir: "/"})
	if err != nil || res.Stdout != "yo kept\n/\n" {
		t.Fatalf("per-command env and workdir: %+v %v", res, err)
	}
	if info, err := td.p.Inspect(ctx, sb.ID); err != nil || !info.ExpiresAt.Equal(sb.ExpiresAt) {
		t.Fatalf("inspect: %+v %v, want the daemon's expiry %v", info, err, sb.ExpiresAt)
	}
	// Idle pooled sandboxes are nobody's: not listed, not reachable.
	idle := func() []string {
		var ids []string
		eventually(t, 30*time.Second, "the refill", func() bool { ids = idleIDs(); return len(ids) == 1 })
		return ids
	}()
	list, err := td.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range list {
		if l.ID == idle[0] {
			t.Fatal("List shows an idle pooled sandbox")
		}
	}
	if _, err := td.p.Exec(ctx, idle[0], roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("exec in an idle pooled sandbox: %v", err)
	}

	// A config the pool cannot serve goes cold.
	cold := pyConfig()
	cold.Memory = "256m"
	csb, pooled, err := td.c.Create(ctx, "docker", cold)
	if err != nil || pooled {
		t.Fatalf("create with other memory: pooled %v, %v", pooled, err)
	}

	// Drain: idle sandboxes destroyed, no refill, creates miss.
	n, pools, err := td.c.PoolDrain(ctx, key)
	if err != nil || n != 1 || pools[0].Idle != 0 || !pools[0].Drained {
		t.Fatalf("drain: %d %v %v", n, pools, err)
	}
	eventually(t, 30*time.Second, "the drained sandbox to be gone", func() bool { return td.gone(idle[0]) })
	miss, pooled, err := td.c.Create(ctx, "docker", pyConfig())
	if err != nil || pooled {
		t.Fatalf("create from a drained pool: pooled %v, %v", pooled, err)
	}
	st, err := td.c.PoolStatus(ctx)
	if err != nil || st[0].Hits != 1 || st[0].Misses != 1 || st[0].Idle != 0 || st[0].InUse != 1 {
		t.Fatalf("status after drain: %v %v", st, err)
	}

	// Warmup resumes it; the idle timeout then replaces the idle sandbox.
	if _, err := td.c.PoolWarmup(ctx, key, 0); err != nil {
		t.Fatal(err)
	}
	before := idleIDs()
	eventually(t, 20*time.Second, "the idle timeout to replace the idle sandbox", func() bool {
		now := idleIDs()
		return len(now) == 1 && now[0] != before[0] && td.gone(before[0])
	})

	// The metrics saw it all.
	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://roched/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`roche_pool_hits_total{pool="` + key + `"} 1`,
		`roche_pool_misses_total{pool="` + key + `"} 1`,
		`roche_create_duration_seconds_count{source="pool"} 1`,
		`roche_create_duration_seconds_count{source="cold"} 2`,
		`roche_sandboxes{state="running"} 3`,
		`roche_sandboxes{state="idle"} 1`,
		`roche_exec_duration_seconds_count 2`, // the exec refused before running is not timed
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, id := range []string{sb.ID, csb.ID, miss.ID} {
		if err := td.p.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReaper: a sandbox from the pool, whose container would live far longer, is
// destroyed by the daemon within 5 s of the expiry its create asked for.
func TestReaper(t *testing.T) {
	spec, _ := pool.ParseSpec("docker/" + testImage() + "?min=1")
	td := startDaemon(t, Config{Pools: []pool.Spec{spec}})
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := td.c.PoolWarmup(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	cfg := pyConfig()
	cfg.TimeoutSecs = 1
	sb, pooled, err := td.c.Create(ctx, "docker", cfg)
	if err != nil || !pooled {
		t.Fatalf("create: %v %v", pooled, err)
	}
	eventually(t, time.Until(sb.ExpiresAt)+5*time.Second, "the reaper", func() bool { return td.gone(sb.ID) })
	if _, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("exec after expiry: %v", err)
	}
}

// TestAdmission: past --max-sandboxes a create fails at once with RESOURCE_EXHAUSTED,
// pool hit or not, and makes nothing.
func TestAdmission(t *testing.T) {
	spec, _ := pool.ParseSpec("docker/" + testImage() + "?min=1")
	td := startDaemon(t, Config{MaxSandboxes: 1, Pools: []pool.Spec{spec}})
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := td.c.PoolWarmup(ctx, "", 0); err != nil {
		t.Fatal(err)
	}
	cold := pyConfig()
	cold.Memory = "256m"
	first, err := td.p.Create(ctx, cold)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the pool to be full", func() bool { return td.d.ledger.Pools()[0].Status().Idle == 1 })
	made := len(td.rec.ids())
	for _, cfg := range []roche.Config{cold, pyConfig()} { // cold, and one the pool would serve
		start := time.Now()
		_, err := td.p.Create(ctx, cfg)
		if !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "limit of 1 sandboxes (--max-sandboxes)") {
			t.Fatalf("create past the limit: %v", err)
		}
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != connect.CodeResourceExhausted {
			t.Fatalf("code: %v", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("refusal took %v: want at once", took)
		}
	}
	if n := len(td.rec.ids()); n != made {
		t.Fatalf("refused creates made %d sandboxes", n-made)
	}
	if st := td.d.ledger.Pools()[0].Status(); st.Idle != 1 || st.Hits != 0 {
		t.Fatalf("a refused create touched the pool: %+v", st)
	}
	// Room again once one is destroyed.
	if err := td.p.Destroy(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	second, err := td.p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatalf("create after a destroy: %v", err)
	}
	_ = td.p.Destroy(ctx, second.ID)
}

// TestTCPNeedsToken: TCP is refused without a token; with one, calls without it get
// UNAUTHENTICATED (and /metrics 401) while /healthz stays open.
func TestTCPNeedsToken(t *testing.T) {
	dir := shortDir(t)
	_, err := New(Config{Socket: dir + "/a.sock", Listen: "tcp://127.0.0.1:0"}, map[string]roche.Provider{"docker": nil})
	if err == nil || !strings.Contains(err.Error(), "without a token") {
		t.Fatalf("TCP without a token: %v", err)
	}
	td := startDaemon(t, Config{Listen: "tcp://127.0.0.1:0", Token: "s3cret"})
	addr := "http://" + td.d.TCPAddr().String()
	ctx := ctxFor(t, time.Minute)

	anon, err := client.New(client.WithAddress(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	_, err = anon.Provider("docker").List(ctx)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "bearer token") {
		t.Fatalf("no token: %v", err)
	}
	wrong, _ := client.New(client.WithAddress(addr), client.WithToken("guess"))
	defer wrong.Close()
	if _, err := wrong.Provider("docker").List(ctx); connectCode(err) != connect.CodeUnauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
	// gRPC clients get the same answer.
	grpcAnon, _ := client.New(client.WithAddress(addr), client.WithGRPC())
	defer grpcAnon.Close()
	if _, err := grpcAnon.PoolStatus(ctx); connectCode(err) != connect.CodeUnauthenticated {
		t.Fatalf("gRPC without a token: %v", err)
	}
	if h, err := anon.Health(ctx); err != nil || h.Status != "ok" {
		t.Fatalf("/healthz without a token: %+v %v", h, err)
	}
	resp, err := http.Get(addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/metrics without a token: %s", resp.Status)
	}
	http.DefaultClient.CloseIdleConnections()

	// The unix socket, owner-only, needs no token: the CLI there just works.
	local, _ := client.New(client.WithSocket(td.socket))
	defer local.Close()
	if _, err := local.Provider("docker").List(ctx); err != nil {
		t.Fatalf("unix socket without a token: %v", err)
	}

	good, _ := client.New(client.WithAddress(addr), client.WithToken("s3cret"))
	defer good.Close()
	if _, err := good.Provider("docker").List(ctx); err != nil {
		t.Fatalf("with the token: %v", err)
	}
}

func connectCode(err error) connect.Code {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return connect.CodeOf(err)
}

// TestPoolWorkdir: a pooled sandbox was made before the workdir was known. One that
// exists in the image, or one under /tmp (made on claim), is served from the pool; one
// that would need the read-only root changed goes cold, where the engine makes it,
// and later creates asking for it go cold without spending a pooled sandbox.
func TestPoolWorkdir(t *testing.T) {
	spec, _ := pool.ParseSpec("docker/" + testImage() + "?min=1")
	td := startDaemon(t, Config{Pools: []pool.Spec{spec}})
	ctx := ctxFor(t, 2*time.Minute)
	st := func() *rochev1.Pool {
		t.Helper()
		eventually(t, 30*time.Second, "the pool to refill", func() bool {
			s, err := td.c.PoolStatus(ctx)
			return err == nil && s[0].Idle == 1 && s[0].Creating == 0
		})
		s, _ := td.c.PoolStatus(ctx)
		return s[0]
	}
	cases := []struct {
		workdir string
		pooled  bool
	}{
		{"/usr/lib", true}, // in the image
		{"/tmp/a/b", true}, // made on the sandbox's tmpfs
		{"/work", false},   // missing from the image: cold
		{"/work/", false},  // remembered: cold at once
		{"/tmp/a/b", true}, // under /tmp every sandbox gets its own
		{"/usr/lib/../lib", true},
	}
	for _, c := range cases {
		before := st()
		cfg := pyConfig()
		cfg.Workdir = c.workdir
		sb, pooled, err := td.c.Create(ctx, "docker", cfg)
		if err != nil || pooled != c.pooled {
			t.Fatalf("workdir %s: pooled %v (want %v), %v", c.workdir, pooled, c.pooled, err)
		}
		res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"pwd"}})
		if want := path.Clean(c.workdir) + "\n"; err != nil || res.Stdout != want {
			t.Fatalf("workdir %s: pwd %+v %v", c.workdir, res, err)
		}
		if err := td.p.Destroy(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		after := st()
		if c.workdir == "/work/" && after.Hits+after.Misses != before.Hits+before.Misses {
			t.Fatalf("a workdir known not to suit the pool still took from it: %v -> %v", before, after)
		}
	}
}

// TestPoolCodeWarm: through roched, a pool with code=python hands out sandboxes whose
// first run_code takes the interpreter started while they were idle (its pid is below a
// command's run after the hand-out); a create served from the pool with env and a
// workdir of its own gets an interpreter started with them instead, so the warm-up never
// shows a cell the pool's environment in place of the caller's.
func TestPoolCodeWarm(t *testing.T) {
	spec, _ := pool.ParseSpec("docker/" + testImage() + "?min=1&code=python")
	td := startDaemon(t, Config{Pools: []pool.Spec{spec}})
	ctx := ctxFor(t, 2*time.Minute)
	idle := func() {
		t.Helper()
		eventually(t, 30*time.Second, "the pool to refill", func() bool {
			s, err := td.c.PoolStatus(ctx)
			return err == nil && s[0].Idle == 1 && s[0].Creating == 0
		})
	}
	pidCode := "import os\nprint(os.getpid(), os.environ.get('ROCHE_WARM_T', '-'), os.getcwd())"

	idle()
	sb, pooled, err := td.c.Create(ctx, "docker", pyConfig())
	if err != nil || !pooled {
		t.Fatalf("create: pooled %v, %v", pooled, err)
	}
	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "import os; print(os.getpid())"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	after, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
	ex, err := td.p.RunCode(ctx, sb.ID, roche.CodeRequest{Code: pidCode})
	if err != nil || ex.Error != nil || ex.ExecutionCount != 1 {
		t.Fatalf("first cell: %+v %v", ex, err)
	}
	var pid int
	var env, cwd string
	if _, err := fmt.Sscan(strings.Join(ex.Logs.Stdout, ""), &pid, &env, &cwd); err != nil || env != "-" || pid == 0 || pid >= after {
		t.Fatalf("first cell printed %q; a command run after the hand-out was pid %d: want the warmed interpreter's lower pid and no ROCHE_WARM_T", ex.Logs.Stdout, after)
	}
	_ = td.p.Destroy(ctx, sb.ID)

	idle()
	cfg := pyConfig()
	cfg.Env = map[string]string{"ROCHE_WARM_T": "caller"}
	cfg.Workdir = "/tmp/warm"
	sb, pooled, err = td.c.Create(ctx, "docker", cfg)
	if err != nil || !pooled {
		t.Fatalf("create with env and workdir: pooled %v, %v", pooled, err)
	}
	defer td.p.Destroy(context.WithoutCancel(ctx), sb.ID)
	ex, err = td.p.RunCode(ctx, sb.ID, roche.CodeRequest{Code: pidCode})
	if err != nil || ex.Error != nil {
		t.Fatalf("first cell with env: %+v %v", ex, err)
	}
	if _, err := fmt.Sscan(strings.Join(ex.Logs.Stdout, ""), &pid, &env, &cwd); err != nil || env != "caller" || cwd != "/tmp/warm" {
		t.Fatalf("first cell of a create with env and workdir printed %q: want its env and workdir", ex.Logs.Stdout)
	}
}

// TestExecCancelKills: a command lives as long as the call that started it; when the
// client goes away, the daemon's call is cancelled and the command killed.
func TestExecCancelKills(t *testing.T) {
	td := startDaemon(t, Config{})
	ctx := ctxFor(t, time.Minute)
	sb, err := td.p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	_, err = td.p.Exec(cctx, sb.ID, roche.ExecRequest{
		Cmd:    []string{"python3", "-c", "import time; print('started', flush=True); time.sleep(60)", "marker-cancel"},
		Stdout: &out,
	})
	if err == nil || time.Since(start) > 10*time.Second || out.String() != "started\n" {
		t.Fatalf("cancelled exec: %v after %v, output %q", err, time.Since(start), out.String())
	}
	probe := "import os\nfor p in os.listdir('/proc'):\n    try:\n        c = open('/proc/%s/cmdline' % p, 'rb').read()\n    except Exception:\n        continue\n    if b'marker-cancel' in c and b'probe' not in c:\n        print(p)\n"
	eventually(t, 10*time.Second, "the command to be killed", func() bool {
		res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", probe, "probe"}})
		return err == nil && res.ExitCode == 0 && res.Stdout == ""
	})
	_ = td.p.Destroy(ctx, sb.ID)
}

// TestPoolQueue: with a queue, a create that finds the pool empty is served the pool's
// next sandbox (pooled, on the real engine) instead of making its own, and creates past
// the queue are refused at once with RESOURCE_EXHAUSTED, leaving nothing behind.
func TestPoolQueue(t *testing.T) {
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=0&max=0&queue=1")
	if err != nil {
		t.Fatal(err)
	}
	td := startDaemon(t, Config{Pools: []pool.Spec{spec}})
	ctx := ctxFor(t, 2*time.Minute)

	type outcome struct {
		sb     roche.SandboxInfo
		pooled bool
		err    error
		took   time.Duration
	}
	out := make(chan outcome, 3)
	for range 3 {
		go func() {
			start := time.Now()
			sb, pooled, err := td.c.Create(ctx, "docker", pyConfig())
			out <- outcome{sb, pooled, err, time.Since(start)}
		}()
	}
	var served, refused int
	for range 3 {
		o := <-out
		switch {
		case o.err == nil:
			served++
			t.Cleanup(func() { _ = td.p.Destroy(context.Background(), o.sb.ID) })
			res, err := td.p.Exec(ctx, o.sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('hello')"}})
			if err != nil || res.Stdout != "hello\n" {
				t.Errorf("exec in a sandbox served from the queue: %+v %v", res, err)
			}
		case errors.Is(o.err, roche.ErrExhausted):
			refused++
			if o.took > 5*time.Second || !strings.Contains(o.err.Error(), "queue") {
				t.Errorf("refusal after %s: %v; want one naming the queue, at once", o.took, o.err)
			}
			// The hint of when to retry crosses the API as a RetryInfo detail.
			if after, ok := roche.RetryDelay(o.err); !ok || after <= 0 {
				t.Errorf("refusal %v: retry hint %v %v, want a positive wait", o.err, after, ok)
			}
		default:
			t.Errorf("create: %v", o.err)
		}
	}
	if served < 1 || refused < 1 || served+refused != 3 {
		t.Fatalf("%d served, %d refused of 3 creates on a pool with a queue of 1", served, refused)
	}
	st, err := td.c.PoolStatus(ctx)
	if err != nil || len(st) != 1 || st[0].MaxQueue != 1 || st[0].Waiting != 0 {
		t.Fatalf("pool status %v %v, want queue 1 and nothing waiting", st, err)
	}
	// What the queue served came from the pool (made by it, for the create waiting).
	if st[0].Hits < 1 {
		t.Fatalf("pool status %v: no hit for the create served from the queue", st[0])
	}
}
