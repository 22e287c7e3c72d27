package docker_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// connectProbe tries each "name|host|port" given and prints, as JSON, what each got:
// "ok: <banner>" or "error: <errno> <message>".
const connectProbe = `
import errno, json, socket, sys
out = {}
for spec in sys.argv[1:]:
    name, host, port = spec.split('|')
    try:
        ai = socket.getaddrinfo(host, int(port), 0, socket.SOCK_STREAM)[0]
        s = socket.socket(ai[0], socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(ai[4])
            out[name] = 'ok: ' + s.recv(100).decode().strip()
        finally:
            s.close()
    except OSError as e:
        out[name] = 'error: %s %s' % (errno.errorcode.get(e.errno, e.errno), e)
try:
    out['ipv6_addresses'] = open('/proc/net/if_inet6').read().strip()
except OSError as e:
    out['ipv6_addresses'] = 'error: %s' % e
print(json.dumps(out))
`

const (
	metadataBanner = "roche-test-metadata-standin"
	hostBanner     = "roche-test-host-address"
)

// testbed is a network namespace holding 169.254.169.254 (standing in for a cloud
// metadata service) and a peer address, joined to the host by a veth pair whose host end
// holds an address standing in for the host's own. The host routes 169.254.169.254 into
// the namespace, so no packet of the test can reach a real metadata service.
type testbed struct {
	ns, hostDev   string
	hostAddr      netip.Addr // on hostDev: one of the host's own addresses
	peerAddr      netip.Addr // in the namespace: an ordinary neighbour
	metadata      netip.Addr
	hostPort      int // a listener of this test on hostAddr
	listenerClose func()
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func newTestbed(t *testing.T) *testbed {
	b := make([]byte, 3)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	tb := &testbed{
		ns: "rochetest-" + suffix, hostDev: "rtn" + suffix,
		hostAddr: netip.AddrFrom4([4]byte{198, 18, b[0], 1}),
		peerAddr: netip.AddrFrom4([4]byte{198, 18, b[0], 2}),
		metadata: netip.MustParseAddr("169.254.169.254"),
	}
	nsDev := "rtp" + suffix
	run(t, "ip", "netns", "add", tb.ns)
	t.Cleanup(func() { tb.cleanup(t) })
	run(t, "ip", "link", "add", tb.hostDev, "type", "veth", "peer", "name", nsDev, "netns", tb.ns)
	run(t, "ip", "addr", "add", tb.hostAddr.String()+"/24", "dev", tb.hostDev)
	run(t, "ip", "link", "set", tb.hostDev, "up")
	run(t, "ip", "-n", tb.ns, "addr", "add", tb.peerAddr.String()+"/24", "dev", nsDev)
	run(t, "ip", "-n", tb.ns, "addr", "add", tb.metadata.String()+"/32", "dev", nsDev)
	run(t, "ip", "-n", tb.ns, "link", "set", nsDev, "up")
	run(t, "ip", "-n", tb.ns, "link", "set", "lo", "up")

	// One host route for 169.254.169.254 at a time: wait, bounded, for another test's.
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := exec.Command("ip", "route", "add", tb.metadata.String()+"/32", "via", tb.peerAddr.String(), "dev", tb.hostDev).CombinedOutput()
		if err == nil {
			break
		}
		if !strings.Contains(string(out), "File exists") || time.Now().After(deadline) {
			t.Fatalf("routing %s into the test's namespace: %v: %s (a host route for it already exists: this test will not send traffic to a real metadata service)", tb.metadata, err, out)
		}
		time.Sleep(time.Second)
	}
	// A port the host forwards: the host's address, port 81, rewritten to the neighbour.
	dnat := []string{"-w", "-t", "nat", "PREROUTING", "-d", tb.hostAddr.String() + "/32", "-p", "tcp", "--dport", "81",
		"-j", "DNAT", "--to-destination", tb.peerAddr.String() + ":80"}
	run(t, "iptables", dnatArgs("-I", dnat)...)
	t.Cleanup(func() { run(t, "iptables", dnatArgs("-D", dnat)...) })

	out, err := exec.Command("ip", "route", "get", tb.metadata.String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev "+tb.hostDev+" ") {
		t.Fatalf("%s does not route into the test's namespace: %v: %s", tb.metadata, err, out)
	}

	// The stand-in metadata service: this test binary, in the namespace, by pid.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", tb.ns, exe)
	cmd.Env = append(os.Environ(), "ROCHE_TEST_BANNER_LISTEN=0.0.0.0:80", "ROCHE_TEST_BANNER_TEXT="+metadataBanner)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- strings.TrimSpace(line) == "ready"
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("the namespace's listener did not start")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the namespace's listener did not start within 30 s")
	}

	// The host's own address, served by this test.
	port, closeFn := listenBanner(t, net.JoinHostPort(tb.hostAddr.String(), "0"), hostBanner)
	tb.hostPort, tb.listenerClose = port, closeFn
	return tb
}

// dnatArgs puts the action (-I, -D) before the chain of a nat rule.
func dnatArgs(action string, rule []string) []string {
	return append([]string{rule[0], rule[1], rule[2], action}, rule[3:]...)
}

// cleanup removes the route, the veth pair and the namespace, and checks they are gone.
func (tb *testbed) cleanup(t *testing.T) {
	exec.Command("ip", "route", "del", tb.metadata.String()+"/32", "via", tb.peerAddr.String(), "dev", tb.hostDev).Run()
	exec.Command("ip", "link", "del", tb.hostDev).Run()
	if out, err := exec.Command("ip", "netns", "del", tb.ns).CombinedOutput(); err != nil {
		t.Errorf("removing namespace %s: %v: %s", tb.ns, err, out)
	}
	if _, err := net.InterfaceByName(tb.hostDev); err == nil {
		t.Errorf("veth %s survived", tb.hostDev)
	}
	if out, _ := exec.Command("ip", "route", "show", tb.metadata.String()+"/32").CombinedOutput(); strings.Contains(string(out), tb.hostDev) {
		t.Errorf("route survived: %s", out)
	}
}

// listenBanner serves banner on addr until the test ends and returns the port.
func listenBanner(t *testing.T, addr, banner string) (int, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, banner)
			c.Close()
		}
	}()
	var once sync.Once
	closeFn := func() { once.Do(func() { ln.Close(); wg.Wait() }) }
	t.Cleanup(closeFn)
	return ln.Addr().(*net.TCPAddr).Port, closeFn
}

func target(name string, host netip.Addr, port int) string {
	return fmt.Sprintf("%s|%s|%d", name, host, port)
}

func decodeProbe(t *testing.T, who, out string) map[string]string {
	t.Helper()
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%s: probe printed %q: %v", who, out, err)
	}
	return got
}

// runOnDefaultBridge runs the probe in a plain container on Docker's default bridge,
// which no Roche rule touches: the positive control.
func runOnDefaultBridge(t *testing.T, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.ContainerCreate(ctx, &container.Config{
		Image: testenv.Image(), User: "65534:65534",
		Cmd:    append([]string{"python3", "-c", connectProbe}, args...),
		Labels: map[string]string{"roche.test": "network-positive-control"},
	}, &container.HostConfig{NetworkMode: "bridge", CapDrop: []string{"ALL"}, ReadonlyRootfs: true}, nil, nil, "")
	if err != nil {
		t.Fatalf("creating the control container: %v", err)
	}
	defer cli.ContainerRemove(context.Background(), resp.ID, container.RemoveOptions{Force: true})
	if err := cli.ContainerStart(ctx, resp.ID, container.StartOptions{}); err != nil {
		t.Fatalf("starting the control container: %v", err)
	}
	waitC, errC := cli.ContainerWait(ctx, resp.ID, container.WaitConditionNotRunning)
	select {
	case <-waitC:
	case err := <-errC:
		t.Fatalf("waiting for the control container: %v", err)
	}
	logs, err := cli.ContainerLogs(ctx, resp.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	var stdout, stderr bytes.Buffer
	if _, err := stdcopy.StdCopy(&stdout, &stderr, logs); err != nil {
		t.Fatal(err)
	}
	if stdout.Len() == 0 {
		t.Fatalf("control container printed nothing; stderr %q", stderr.String())
	}
	return stdout.String()
}

// TestNetworkSandboxCannotReachHostOrMetadata attacks from inside a --network sandbox: it
// tries a metadata service and the host's own addresses, which a plain container on
// Docker's default bridge reaches (the positive control), and an ordinary neighbour,
// which it must still reach.
func TestNetworkSandboxCannotReachHostOrMetadata(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	tb := newTestbed(t)
	common := []string{
		target("metadata", tb.metadata, 80),
		target("host_own", tb.hostAddr, tb.hostPort),
		target("neighbour", tb.peerAddr, 80),
		target("host_forwarded", tb.hostAddr, 81),
	}

	control := decodeProbe(t, "control", runOnDefaultBridge(t, common...))
	for name, want := range map[string]string{"metadata": "ok: " + metadataBanner, "host_own": "ok: " + hostBanner, "neighbour": "ok: " + metadataBanner, "host_forwarded": "ok: " + metadataBanner} {
		if control[name] != want {
			t.Fatalf("positive control on the default bridge: %s got %q, want %q: the test bed does not work, so it would prove nothing", name, control[name], want)
		}
	}

	p := newProvider(t)
	cfg := testConfig()
	cfg.Network = true
	id := sandbox(t, p, cfg)

	// Another sandbox with a network, listening: the host reaches it, the first may not.
	other := sandbox(t, p, cfg)
	otherIP := sandboxIP(t, other)
	ctx, stopListener := context.WithCancel(context.Background())
	listenerDone := make(chan struct{})
	go func() {
		defer close(listenerDone)
		p.Exec(ctx, other, roche.ExecRequest{Cmd: []string{"python3", "-c", sandboxListener}, Timeout: 2 * time.Minute})
	}()
	defer func() { stopListener(); <-listenerDone }()
	if got := dialBanner(net.JoinHostPort(otherIP.String(), "8080"), 30*time.Second); got != "other-sandbox" {
		t.Fatalf("the host cannot reach the other sandbox's listener (%q): the check below would prove nothing", got)
	}

	// The host's addresses on the sandbox's own bridge, served by this test.
	br, err := net.InterfaceByName(docker.BridgeName)
	if err != nil {
		t.Fatalf("bridge %s: %v", docker.BridgeName, err)
	}
	addrs, _ := br.Addrs()
	args := append([]string(nil), common...)
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.(*net.IPNet).IP)
		ip = ip.Unmap()
		if ip.Is4() {
			port, _ := listenBanner(t, net.JoinHostPort(ip.String(), "0"), hostBanner)
			args = append(args, target("host_gateway", ip, port))
		} else if ip.IsLinkLocalUnicast() {
			port, _ := listenBanner(t, net.JoinHostPort(ip.String()+"%"+docker.BridgeName, "0"), hostBanner)
			args = append(args, fmt.Sprintf("host_link_local|%s%%eth0|%d", ip, port))
		}
	}
	if len(args) == len(common) {
		t.Fatalf("bridge %s has no IPv4 address", docker.BridgeName)
	}
	args = append(args, target("other_sandbox", otherIP, 8080))

	res, err := p.Exec(context.Background(), id, roche.ExecRequest{Cmd: append([]string{"python3", "-c", connectProbe}, args...), Timeout: 2 * time.Minute})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("probe in the sandbox: %+v %v", res, err)
	}
	got := decodeProbe(t, "sandbox", res.Stdout)
	t.Logf("from the --network sandbox: %v", got)
	if got["neighbour"] != "ok: "+metadataBanner {
		t.Errorf("neighbour %s: %q, want it reached: the sandbox's network must still work", tb.peerAddr, got["neighbour"])
	}
	for _, spec := range args {
		name, _, _ := strings.Cut(spec, "|")
		if name == "neighbour" {
			continue
		}
		if !strings.HasPrefix(got[name], "error: ") {
			t.Errorf("%s (%s) from a --network sandbox: %q, want the connection refused", name, spec, got[name])
		}
	}
	if got["ipv6_addresses"] != "" {
		t.Errorf("the sandbox has IPv6 addresses: %q", got["ipv6_addresses"])
	}
}

// sandboxListener serves a banner on port 8080 until its exec is cancelled.
const sandboxListener = `
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 8080)); s.listen(8)
while True:
    c, _ = s.accept(); c.sendall(b'other-sandbox\n'); c.close()
`

// dialBanner reads a banner from addr, retrying until the deadline (the listener may be
// starting).
func dialBanner(addr string, within time.Duration) string {
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			return strings.TrimSpace(line)
		}
		last = err.Error()
		time.Sleep(200 * time.Millisecond)
	}
	return "error: " + last
}

// sandboxIP is a sandbox's address on Roche's network.
func sandboxIP(t *testing.T, id string) netip.Addr {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	c, err := cli.ContainerInspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	ep := c.NetworkSettings.Networks[docker.NetworkName]
	if ep == nil {
		t.Fatalf("sandbox %s is not on the network %s: %v", id, docker.NetworkName, c.NetworkSettings.Networks)
	}
	ip, err := netip.ParseAddr(ep.IPAddress)
	if err != nil {
		t.Fatalf("sandbox %s address %q: %v", id, ep.IPAddress, err)
	}
	return ip
}

// TestNetworkRefusedWithoutFirewall: where the rules cannot be installed, a sandbox with
// a network is refused, never created unfiltered, and nothing is left behind. The iptables
// tools are replaced, so the host's real tables are not touched.
func TestNetworkRefusedWithoutFirewall(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	noRoche := "#!/bin/sh\nprintf '*filter\\n:INPUT ACCEPT [0:0]\\n:FORWARD DROP [0:0]\\n:OUTPUT ACCEPT [0:0]\\n:DOCKER-USER - [0:0]\\n-A DOCKER-USER -j RETURN\\nCOMMIT\\n'\n"
	for _, c := range []struct {
		name    string
		save    string // script body; "" leaves the tool out
		restore string
		want    string
	}{
		{"no iptables", "", "", "iptables-save is missing"},
		{"restore fails", noRoche, "#!/bin/sh\necho 'iptables-restore: Permission denied (you must be root)' >&2\nexit 4\n", "installing the IPv4 rules with iptables-restore"},
		{"restore changes nothing", noRoche, "#!/bin/sh\ncat >/dev/null\n", "do not read back as written"},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			dir := t.TempDir()
			for _, tool := range []string{"iptables", "ip6tables"} {
				if c.save != "" {
					os.WriteFile(filepath.Join(dir, tool+"-save"), []byte(c.save), 0o755)
					os.WriteFile(filepath.Join(dir, tool+"-restore"), []byte(c.restore), 0o755)
				}
			}
			p := newProvider(t, docker.WithFirewallDir(dir))
			start := time.Now().Add(-time.Second)
			cfg := testConfig()
			cfg.Network = true
			info, err := p.Create(context.Background(), cfg)
			if err == nil {
				p.Destroy(context.Background(), info.ID)
				t.Fatal("a sandbox with a network was created without its firewall rules")
			}
			if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--allow-host") {
				t.Fatalf("error %v, want ErrUnsupported saying %q and naming --allow-host", err, c.want)
			}
			if left := networkSandboxesSince(t, start); len(left) > 0 {
				t.Fatalf("a refused create left sandboxes with a network: %v", left)
			}
		})
	}
}

// networkSandboxesSince lists Roche containers with a network created since start (other
// tests on the engine may be making sandboxes meanwhile, rarely with a network).
func networkSandboxesSince(t *testing.T, start time.Time) []string {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cs, err := cli.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", docker.LabelManaged+"=true"))})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range cs {
		var cfg roche.Config
		json.Unmarshal([]byte(c.Labels[docker.LabelConfig]), &cfg)
		if cfg.Network && !time.Unix(c.Created, 0).Before(start) {
			out = append(out, c.ID)
		}
	}
	return out
}
