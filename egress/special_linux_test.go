package egress

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestEgressNewHostAddressRefusedAtOnce gives this host a new address (on a veth pair the
// test makes and leaves down, so no packet moves) and asks for it through the proxy at
// once: the host's addresses are read at each decision, never from a stale list.
func TestEgressNewHostAddressRefusedAtOnce(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	b := make([]byte, 3)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	dev, peer := "rte"+suffix, "rtf"+suffix
	addr := netip.AddrFrom4([4]byte{198, 19, b[0], b[1] | 1})
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("link", "add", dev, "type", "veth", "peer", "name", peer)
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			exec.Command("ip", "link", "del", dev).Run()
		}
	})

	var d refusingDialer
	res := fakeResolver{"new.example": {addr}}
	_, proxy := startProxy(t, Options{Resolver: res, Dial: d.dial}, "*.example")
	code, body := ask(t, proxy, http.MethodGet, "new.example")
	if code != http.StatusForbidden || strings.Contains(body, "address of this host") {
		t.Fatalf("before the address exists: %d %q, want 403 for the benchmarking block only", code, body)
	}

	ip("addr", "add", addr.String()+"/32", "dev", dev)
	code, body = ask(t, proxy, http.MethodGet, "new.example")
	if want := fmt.Sprintf("%s is an address of this host (interface %s)", addr, dev); code != http.StatusForbidden || !strings.Contains(body, want) {
		t.Fatalf("right after adding %s to %s: %d %q, want 403 saying %q", addr, dev, code, body, want)
	}

	ip("link", "del", dev)
	deleted = true
	code, body = ask(t, proxy, http.MethodGet, "new.example")
	if code != http.StatusForbidden || strings.Contains(body, "address of this host") || !strings.Contains(body, "198.18.0.0/15") {
		t.Fatalf("after removing it: %d %q, want 403 naming only 198.18.0.0/15", code, body)
	}
	if n := d.n.Load(); n != 0 {
		t.Fatalf("the proxy dialled %d refused targets", n)
	}
}
