package daemon

import (
	"context"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
)

// TestReflectionAndZeros: the API answers server reflection over gRPC (as grpcurl and
// buf curl ask), listing SandboxService and describing its methods; and JSON answers
// carry zero values ("exitCode": 0) instead of leaving them out.
func TestReflectionAndZeros(t *testing.T) {
	td := startDaemon(t, Config{})
	tr := &http.Transport{
		Protocols: new(http.Protocols),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", td.socket)
		},
	}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	ctx := ctxFor(t, time.Minute)
	rc := grpcreflect.NewClient(&http.Client{Transport: tr}, "http://roched", connect.WithGRPC())
	stream := rc.NewStream(ctx)
	names, err := stream.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, n := range names {
		found = append(found, string(n))
	}
	if !slices.Contains(found, "roche.v1.SandboxService") {
		t.Fatalf("reflection lists %v, not roche.v1.SandboxService", found)
	}
	files, err := stream.FileContainingSymbol("roche.v1.SandboxService")
	if err != nil {
		t.Fatal(err)
	}
	var methods []string
	for _, f := range files {
		for _, s := range f.GetService() {
			for _, m := range s.GetMethod() {
				methods = append(methods, m.GetName())
			}
		}
	}
	if !slices.Contains(methods, "Create") || !slices.Contains(methods, "Hold") {
		t.Fatalf("reflection describes methods %v", methods)
	}
	stream.Close()

	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()
	code, out := postJSON(t, hc, "http://roched", "Create", `{"config": {"image": "`+testImage()+`"}}`)
	if code != 200 {
		t.Fatalf("create: HTTP %d %v", code, out)
	}
	id := out["sandbox"].(map[string]any)["id"].(string)
	defer td.p.Destroy(context.Background(), id)
	code, out = postJSON(t, hc, "http://roched", "Exec", `{"sandboxId": "`+id+`", "cmd": ["true"]}`)
	res, _ := out["result"].(map[string]any)
	if code != 200 || res == nil {
		t.Fatalf("exec: HTTP %d %v", code, out)
	}
	if v, ok := res["exitCode"]; !ok || v != float64(0) {
		t.Fatalf("exec true: exitCode %v (present: %v) in %v", v, ok, res)
	}
}
