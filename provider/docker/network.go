package docker

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/network"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
)

// A sandbox with Network on joins NetworkName, a bridge network Roche makes on demand
// (never Docker's default "bridge"), whose Linux bridge has the fixed name BridgeName so
// that host firewall rules can single out its traffic: from BridgeName, nothing reaches
// the host's own addresses (INPUT) and nothing is forwarded to cloud metadata addresses,
// the link-local range or a port the host forwards elsewhere (FORWARD, from DOCKER-USER).
// The rules live in the host's tables, outside every sandbox; a sandbox has no capability
// to touch even its own. The network and the rules are kept once made (see docs/network.md).
const (
	NetworkName = "roche"
	BridgeName  = "roche0"
	// LabelNetwork marks the network as Roche's, beside LabelManaged.
	LabelNetwork = "roche.network"
)

// Firewall chains Roche owns, in the filter table of iptables and ip6tables.
const (
	chainForward = "ROCHE-FORWARD"
	chainInput   = "ROCHE-INPUT"
)

// networkOptions are the bridge driver options of NetworkName: the fixed bridge name,
// and no traffic between sandboxes (inter-container communication off).
var networkOptions = map[string]string{
	"com.docker.network.bridge.name":                 BridgeName,
	"com.docker.network.bridge.enable_icc":           "false",
	"com.docker.network.bridge.enable_ip_masquerade": "true",
}

// networkSysctls turn IPv6 off inside a networked sandbox: NetworkName has no IPv6, and
// a link-local IPv6 address would otherwise still reach the host's own on BridgeName.
var networkSysctls = map[string]string{
	"net.ipv6.conf.all.disable_ipv6":     "1",
	"net.ipv6.conf.default.disable_ipv6": "1",
}

// ensureNetwork makes sure NetworkName exists and the host firewall guards it, or says
// why a sandbox cannot have a network here: an unfiltered network is never handed out.
func (p *Provider) ensureNetwork(ctx context.Context) error {
	if err := p.checkFirewall(); err != nil {
		return noFirewall(err)
	}
	unlock, err := p.lockNetwork()
	if err != nil {
		return noFirewall(err)
	}
	defer unlock()
	if err := p.ensureDockerNetwork(ctx); err != nil {
		return err
	}
	if err := p.ensureFirewall(); err != nil {
		return noFirewall(err)
	}
	return nil
}

func noFirewall(err error) error {
	return fmt.Errorf("%w: a sandbox with a network needs host firewall rules that keep it off this host's addresses and cloud metadata, and they cannot be installed: %v (run Roche as root on the Docker host, or give the sandbox --allow-host HOST instead of --network)",
		roche.ErrUnsupported, err)
}

// ensureDockerNetwork creates NetworkName when it is missing and refuses one Roche did
// not make or made otherwise.
func (p *Provider) ensureDockerNetwork(ctx context.Context) error {
	n, err := p.cli.NetworkInspect(ctx, NetworkName, network.InspectOptions{})
	if cerrdefs.IsNotFound(err) {
		noIPv6 := false
		_, err = p.cli.NetworkCreate(ctx, NetworkName, network.CreateOptions{
			Driver:     "bridge",
			EnableIPv6: &noIPv6,
			Options:    networkOptions,
			Labels:     map[string]string{LabelManaged: "true", LabelNetwork: "docker"},
		})
		if err != nil && !cerrdefs.IsConflict(err) {
			return p.engineErr("creating the Docker network "+NetworkName+" for sandboxes with a network", err)
		}
		p.log.Info("created the Docker network for sandboxes with a network", "network", NetworkName, "bridge", BridgeName)
		n, err = p.cli.NetworkInspect(ctx, NetworkName, network.InspectOptions{})
	}
	if err != nil {
		return p.engineErr("inspecting the Docker network "+NetworkName, err)
	}
	var wrong []string
	if n.Labels[LabelNetwork] != "docker" {
		wrong = append(wrong, "it has no label "+LabelNetwork+"=docker")
	}
	if n.Driver != "bridge" {
		wrong = append(wrong, "its driver is "+n.Driver)
	}
	for k, v := range networkOptions {
		if n.Options[k] != v {
			wrong = append(wrong, fmt.Sprintf("its option %s is %q, not %q", k, n.Options[k], v))
		}
	}
	if n.EnableIPv6 {
		wrong = append(wrong, "it has IPv6")
	}
	if len(wrong) > 0 {
		return fmt.Errorf("%w: the Docker network %s is not the one Roche makes (%s): remove it (docker network rm %s) and Roche makes its own",
			roche.ErrUnavailable, NetworkName, strings.Join(wrong, "; "), NetworkName)
	}
	return nil
}

// firewallRules is what Roche keeps in one address family's filter table.
type firewallRules struct {
	family string // "IPv4" or "IPv6"
	save   string // iptables-save, ip6tables-save
	load   string // iptables-restore, ip6tables-restore
	// forward and input are the bodies of chainForward and chainInput, each rule as
	// iptables-save prints it, without "-A CHAIN ".
	forward, input []string
}

// rejectV4 answers a refused IPv4 packet with "administratively prohibited", so that
// a program inside fails at once with EHOSTUNREACH instead of waiting for a timeout.
const (
	rejectV4 = "-j REJECT --reject-with icmp-admin-prohibited"
	rejectV6 = "-j REJECT --reject-with icmp6-adm-prohibited"
)

// ipv4Rules: forwarded traffic from BridgeName may not go to the link-local range (where
// most metadata services live), to any other cloud metadata address, or to a destination
// the host rewrote (DNAT: a port the host publishes, reached through the host's address);
// traffic for the host itself from BridgeName is refused but for replies to connections
// the host opened.
func ipv4Rules() firewallRules {
	linkLocal := netip.MustParsePrefix("169.254.0.0/16")
	fwd := []string{
		"-m conntrack --ctstate DNAT --ctdir ORIGINAL " + rejectV4,
		"-d " + linkLocal.String() + " " + rejectV4,
	}
	for _, a := range egress.MetadataAddrs() {
		if a.Is4() && !linkLocal.Contains(a) {
			fwd = append(fwd, "-d "+a.String()+"/32 "+rejectV4)
		}
	}
	return firewallRules{
		family: "IPv4", save: "iptables-save", load: "iptables-restore",
		forward: fwd,
		input:   []string{"-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN", rejectV4},
	}
}

// ipv6Rules refuse every IPv6 packet from BridgeName: NetworkName has no IPv6, and
// sandboxes have it turned off; this holds even if one found a way to send some.
func ipv6Rules() firewallRules {
	return firewallRules{
		family: "IPv6", save: "ip6tables-save", load: "ip6tables-restore",
		forward: []string{rejectV6},
		input:   []string{rejectV6},
	}
}

// filterTable is the part of an iptables-save dump of the filter table that matters here.
type filterTable struct {
	chains map[string]bool
	rules  map[string][]string // by chain, in order, without "-A CHAIN "
}

func parseFilterTable(dump string) (filterTable, error) {
	t := filterTable{chains: map[string]bool{}, rules: map[string][]string{}}
	inFilter := false
	for _, line := range strings.Split(dump, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "*filter":
			inFilter = true
		case strings.HasPrefix(line, "*"), line == "COMMIT":
			inFilter = false
		case !inFilter:
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			t.chains[name] = true
		case strings.HasPrefix(line, "-A "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			t.rules[chain] = append(t.rules[chain], rule)
		}
	}
	if !t.chains["INPUT"] || !t.chains["FORWARD"] {
		return t, fmt.Errorf("no filter table in the dump")
	}
	return t, nil
}

// forwardHook is where forwarded traffic is caught: DOCKER-USER, which Docker keeps
// first in FORWARD and never flushes, or FORWARD itself where Docker made no such chain
// (ip6tables without IPv6 networks).
func (t filterTable) forwardHook() string {
	if t.chains["DOCKER-USER"] {
		return "DOCKER-USER"
	}
	return "FORWARD"
}

// plan returns the iptables-restore input that brings t to what rs wants, or "" when t
// already has it: both chains with exactly their rules, each jumped to once, by the first
// rule of its hook, for traffic from BridgeName.
func (rs firewallRules) plan(t filterTable) string {
	hooks := []struct{ chain, target string }{{t.forwardHook(), chainForward}, {"INPUT", chainInput}}
	ok := slices.Equal(t.rules[chainForward], rs.forward) && slices.Equal(t.rules[chainInput], rs.input)
	for _, h := range hooks {
		jump := hookRule(h.target)
		ok = ok && len(t.rules[h.chain]) > 0 && t.rules[h.chain][0] == jump && count(t.rules[h.chain], jump) == 1
	}
	if ok {
		return ""
	}
	var b strings.Builder
	b.WriteString("*filter\n")
	// In --noflush mode a declared chain is created if missing and flushed if present.
	fmt.Fprintf(&b, ":%s - [0:0]\n:%s - [0:0]\n", chainForward, chainInput)
	for _, r := range rs.forward {
		fmt.Fprintf(&b, "-A %s %s\n", chainForward, r)
	}
	for _, r := range rs.input {
		fmt.Fprintf(&b, "-A %s %s\n", chainInput, r)
	}
	for _, h := range hooks {
		jump := hookRule(h.target)
		for range count(t.rules[h.chain], jump) {
			fmt.Fprintf(&b, "-D %s %s\n", h.chain, jump)
		}
		fmt.Fprintf(&b, "-I %s 1 %s\n", h.chain, jump)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

func hookRule(target string) string { return "-i " + BridgeName + " -j " + target }

func count(rules []string, r string) int {
	n := 0
	for _, x := range rules {
		if x == r {
			n++
		}
	}
	return n
}
