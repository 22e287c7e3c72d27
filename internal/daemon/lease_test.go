package daemon

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestLeasedSandboxGoesWithItsClient: a leased sandbox lives while its client holds it,
// past the first-hold wait; once the client goes (Close, as a killed process's
// connections close), it is destroyed within the grace; one never held goes after the
// first-hold wait; an unleased one cannot be held.
func TestLeasedSandboxGoesWithItsClient(t *testing.T) {
	td := startDaemon(t, Config{})
	ctx := ctxFor(t, 2*time.Minute)

	c, err := client.New(client.WithSocket(td.socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sb, _, err := c.CreateFor(ctx, "docker", pyConfig(), kit.CreateOptions{Leased: true})
	if err != nil {
		t.Fatal(err)
	}
	// Held past the wait for a first hold, it lives and works.
	time.Sleep(ledger.FirstHold + time.Second)
	res, err := c.Provider("docker").Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"echo", "held"}})
	if err != nil || res.Stdout != "held\n" {
		t.Fatalf("a held sandbox: %q %v", res.Stdout, err)
	}
	c.Close()
	let := time.Now()
	eventually(t, ledger.HoldGrace+10*time.Second, "the sandbox let go of to be destroyed", func() bool { return td.gone(sb.ID) })
	t.Logf("destroyed %v after its client let go", time.Since(let).Round(100*time.Millisecond))

	// Created leased through plain JSON, and never held.
	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()
	code, out := postJSON(t, hc, "http://roched", "Create", `{"provider": "docker", "config": {"image": "`+testImage()+`", "leased": true}}`)
	if code != 200 {
		t.Fatalf("create: HTTP %d %v", code, out)
	}
	id := out["sandbox"].(map[string]any)["id"].(string)
	made := time.Now()
	eventually(t, ledger.FirstHold+15*time.Second, "the sandbox never held to be destroyed", func() bool { return td.gone(id) })
	if el := time.Since(made); el < ledger.FirstHold-time.Second {
		t.Fatalf("a leased sandbox went %v after its create, before the wait for a first hold", el)
	}

	// An unleased sandbox says how to get one that can be held.
	plain, _, err := td.c.Create(ctx, "docker", pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	rpc := rochev1connect.NewSandboxServiceClient(hc, "http://roched")
	stream, err := rpc.Hold(ctx, connect.NewRequest(&rochev1.HoldRequest{SandboxId: plain.ID}))
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "not leased") {
		t.Fatalf("holding an unleased sandbox: %v", err)
	}
	if err := td.p.Destroy(ctx, plain.ID); err != nil {
		t.Fatal(err)
	}
}
