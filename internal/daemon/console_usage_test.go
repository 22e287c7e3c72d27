package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/oci"
)

// TestConsoleUsageOCI: the console's live figures of an oci sandbox, through roched's
// /ui/api/usage: read from the sandbox's own cgroup (its memory limit, its tasks).
func TestConsoleUsageOCI(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	state := filepath.Join("/run/roche-test", "oci-daemon-usage")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(state, 0)
		_ = os.RemoveAll(state)
	})
	p, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 2*time.Minute)
	c, base, token := consoleWith(ctx, t, oci.Name, p)
	cfgSb := pyConfig()
	cfgSb.Memory = "256m"
	sb, err := c.Provider(oci.Name).Create(ctx, cfgSb)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Provider(oci.Name).Destroy(context.WithoutCancel(ctx), sb.ID)
	u, ok := consoleUsage(ctx, t, base, token)[sb.ID]
	if !ok || u.MemoryLimitBytes != 256<<20 || u.MemoryBytes <= 0 || u.Processes < 1 || u.CPUTime <= 0 {
		t.Errorf("the console's usage of oci sandbox %s: %+v (found: %v); want its 256 MiB limit, memory, tasks and CPU time", sb.ID, u, ok)
	}
}

// consoleWith starts a roched serving provider p as name with its console on, over TCP
// with a token, and a client of it; both go, and p is closed, when the test ends, which
// fails if a sandbox of p is left. It answers the client, the console's base URL and the
// token.
// consoleUsage reads the console's figures of every sandbox (/ui/api/usage).
func consoleUsage(ctx context.Context, t *testing.T, base, token string) map[string]kit.Usage {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/ui/api/usage", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var all map[string]kit.Usage
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil {
		t.Fatal(err)
	}
	return all
}

func consoleWith(ctx context.Context, t *testing.T, name string, p interface {
	roche.Provider
	io.Closer
}) (*client.Client, string, string) {
	t.Helper()
	token := randomToken()
	cfg := Config{Socket: filepath.Join(shortDir(t), "roched.sock"), Listen: "tcp://127.0.0.1:0", UI: true, Token: token}
	d, err := New(cfg, map[string]roche.Provider{name: p})
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		p.Close()
		t.Fatal(err)
	}
	base := "http://" + d.TCPAddr().String()
	c, err := client.New(client.WithAddress(base), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		c.Close()
		if left, err := p.List(ctx); err != nil || len(left) != 0 {
			t.Errorf("left behind: %v %v", left, err)
		}
		p.Close()
	})
	return c, base, token
}
