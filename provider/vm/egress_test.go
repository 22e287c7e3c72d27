//go:build linux

package vm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/provider/vm"
)

// routeProbe runs in a VM with an egress allowlist: it lists the network interfaces and
// tries every way out it can name to the host's listener on port PORT besides the
// proxy: QEMU's user-network gateway (10.0.2.2, which forwards to the host's loopback
// when a VM has a user-mode NIC), the loopback address (the guest's own), the host
// over vsock (CID 2), a UDP datagram, and the proxy asked to CONNECT to the host's
// loopback. Then the positive control: the allowed host through the proxy.
const routeProbe = `
import json, os, socket, sys, urllib.request
port, allowed = int(sys.argv[1]), sys.argv[2]
out = {'ifaces': sorted(os.listdir('/sys/class/net'))}
def attempt(name, fn):
    try:
        out[name] = 'ok: ' + str(fn())
    except Exception as e:
        out[name] = 'error: %s: %s' % (type(e).__name__, e)
def tcp(host):
    def f():
        s = socket.create_connection((host, port), timeout=5); s.close(); return 'connected'
    return f
attempt('gateway', tcp('10.0.2.2'))
attempt('loopback', tcp('127.0.0.1'))
def vsock():
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); s.settimeout(5)
    s.connect((2, port)); return 'connected'
attempt('vsock', vsock)
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ('10.0.2.2', port)); return 'sent'
attempt('udp', udp)
def via_proxy():
    s = socket.create_connection(('127.0.0.1', 3128), timeout=10)
    s.sendall(('CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n' % (port, port)).encode())
    return s.recv(200).decode().split('\r\n')[0]
attempt('proxy_loopback', via_proxy)
attempt('allowed', lambda: urllib.request.urlopen('http://%s/' % allowed, timeout=20).read().decode())
print(json.dumps(out))
`

// TestEgressVMNoOtherRoute: a VM given an egress allowlist still has no network device,
// and a program in it reaches the host only through the egress proxy: every other route
// to a listener on the host's loopback fails, and the listener is never reached, while
// the allowed host is (through the proxy, the positive control). A memory snapshot of
// such a VM is refused, saying why.
func TestEgressVMNoOtherRoute(t *testing.T) {
	state := t.TempDir()
	p := newQEMU(t, vm.WithStateDir(state), vm.WithEgressProxy())
	ctx := context.Background()

	var hostConns atomic.Int64
	victim, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	go func() {
		for {
			c, err := victim.Accept()
			if err != nil {
				return
			}
			hostConns.Add(1)
			c.Close()
		}
	}()
	var allowedHits atomic.Int64
	allowedLn, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		allowedHits.Add(1)
		fmt.Fprint(w, "allowed host")
	})}
	go srv.Serve(allowedLn)
	defer srv.Close()
	port := victim.Addr().(*net.TCPAddr).Port

	cfg := testConfig()
	cfg.NetworkAllowlist = []string{allowedLn.Addr().String()}
	info, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(ctx, info.ID) })

	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", routeProbe, fmt.Sprint(port), allowedLn.Addr().String()}, Timeout: 2 * time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("probe: %+v %v", res, err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
		t.Fatalf("probe printed %q: %v", res.Stdout, err)
	}
	t.Logf("probe: %s", res.Stdout)
	if ifaces := fmt.Sprint(got["ifaces"]); ifaces != "[lo]" {
		t.Errorf("the VM has network interfaces %s, want only lo", ifaces)
	}
	for name, want := range map[string]string{
		"gateway":        "error: OSError: [Errno 101] Network is unreachable",
		"loopback":       "error: ConnectionRefusedError",
		"vsock":          "error:",
		"udp":            "error: OSError: [Errno 101] Network is unreachable",
		"proxy_loopback": "ok: HTTP/1.1 403",
		"allowed":        "ok: allowed host",
	} {
		if s, _ := got[name].(string); !strings.HasPrefix(s, want) {
			t.Errorf("%s: %q, want %q", name, s, want)
		}
	}
	if n := hostConns.Load(); n != 0 {
		t.Errorf("%d connections from the VM reached the host's listener", n)
	}
	if allowedHits.Load() != 1 {
		t.Errorf("the allowed host got %d requests, want 1 (the proxy's route is the control)", allowedHits.Load())
	}
	px := egress.Lookup(info.ID)
	if px == nil {
		t.Fatal("no egress proxy registered for the VM")
	}
	ds, _ := px.Log(0)
	refused := false
	for _, d := range ds {
		if d.Host == "127.0.0.1" && d.Port == port && d.Method == "CONNECT" && !d.Allowed {
			refused = true
		}
	}
	if !refused {
		logged, _ := json.Marshal(ds)
		t.Errorf("the decision log lacks the refused CONNECT to the host's loopback: %s", logged)
	}

	// Memory snapshots are refused, naming egress, and leave the VM running.
	if _, err := p.Fork(ctx, info.ID, 1); !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "egress") {
		t.Errorf("Fork of a VM with egress: %v, want ErrUnsupported naming egress", err)
	}
	if err := p.PauseToDisk(ctx, info.ID); !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "egress") {
		t.Errorf("PauseToDisk of a VM with egress: %v, want ErrUnsupported naming egress", err)
	}
	if res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("the VM after the refused snapshots: %+v %v", res, err)
	}
}

// TestEgressRefusedWithoutProxy: without a process serving proxies (a direct CLI), and
// on Firecracker (no relay over vsock), an allowlist is refused before anything is made.
func TestEgressRefusedWithoutProxy(t *testing.T) {
	cfg := testConfig()
	cfg.NetworkAllowlist = []string{"example.com"}
	for _, tc := range []struct {
		name string
		mk   func() (*vm.Provider, error)
		want string
	}{
		{"qemu without WithEgressProxy", func() (*vm.Provider, error) { return vm.NewQEMU(vm.WithStateDir(t.TempDir())) }, "roched"},
		{"firecracker", func() (*vm.Provider, error) {
			return vm.NewFirecracker(vm.WithStateDir(t.TempDir()), vm.WithEgressProxy())
		}, "use the qemu provider"},
	} {
		p, err := tc.mk()
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if p.Capabilities().Egress {
			t.Errorf("%s: Capabilities say egress", tc.name)
		}
		_, err = p.Create(context.Background(), cfg)
		if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrUnsupported saying %q", tc.name, err, tc.want)
		}
	}
}
