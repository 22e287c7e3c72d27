package egress

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
)

// A block is one entry of an address registry whose addresses a sandbox may not reach
// through the proxy unless an allowlist entry names the address literally.
type block struct {
	prefix netip.Prefix
	name   string // as the registry names it
	spec   string // the RFCs the registry cites
	// global is the registry's "Globally Reachable" column, verbatim ("" where the
	// registry leaves it empty: a terminated entry). Only the special-purpose registries
	// have the column.
	global string
	// embeds returns the IPv4 addresses carried inside an address of the block; each is
	// checked as if it had been dialled, so a NAT64, 6to4 or mapped form of a refused
	// IPv4 address is refused.
	embeds func(netip.Addr) []netip.Addr
	// reachable: the block is only another spelling of IPv4 addresses, so it is refused
	// only when what it embeds is. Every other block is refused whole.
	reachable bool
	registry  string
}

// Registries the table is taken from.
const (
	regIPv4Special = "IANA IPv4 Special-Purpose Address Registry"
	regIPv6Special = "IANA IPv6 Special-Purpose Address Registry"
	regIPv6Space   = "IANA IPv6 Address Space"
	regMulticast   = "IANA multicast address space"
	regRoche       = "Roche"
)

// ipv4Special is the IANA IPv4 Special-Purpose Address Registry in full, in its order
// (RFC 6890; the registry as updated through 2025).
//
// Every entry is refused, including those the registry marks globally reachable:
// 192.0.0.9 (PCP anycast) and 192.0.0.10 (TURN anycast) reach whichever PCP server or TURN
// relay the host's own network runs (a PCP server opens ports on the host's NAT);
// 192.31.196.0/24 and 192.175.48.0/24 are AS112 DNS sinks and 192.52.193.0/24 AMT relays,
// anycast infrastructure that serves DNS or multicast tunnels, never a host an allowlist
// names. None of them is worth a hole in the proxy's rule that special addresses are
// never reached by name.
var ipv4Special = []block{
	{prefix: pfx("0.0.0.0/8"), name: `"This network"`, spec: "RFC 791, section 3.2", global: "False"},
	{prefix: pfx("0.0.0.0/32"), name: `"This host on this network"`, spec: "RFC 1122, section 3.2.1.3", global: "False"},
	{prefix: pfx("10.0.0.0/8"), name: "Private-Use", spec: "RFC 1918", global: "False"},
	{prefix: pfx("100.64.0.0/10"), name: "Shared Address Space", spec: "RFC 6598", global: "False"},
	{prefix: pfx("127.0.0.0/8"), name: "Loopback", spec: "RFC 1122, section 3.2.1.3", global: "False"},
	{prefix: pfx("169.254.0.0/16"), name: "Link Local", spec: "RFC 3927", global: "False"},
	{prefix: pfx("172.16.0.0/12"), name: "Private-Use", spec: "RFC 1918", global: "False"},
	{prefix: pfx("192.0.0.0/24"), name: "IETF Protocol Assignments", spec: "RFC 6890, section 2.1", global: "False"},
	{prefix: pfx("192.0.0.0/29"), name: "IPv4 Service Continuity Prefix", spec: "RFC 7335", global: "False"},
	{prefix: pfx("192.0.0.8/32"), name: "IPv4 dummy address", spec: "RFC 7600", global: "False"},
	{prefix: pfx("192.0.0.9/32"), name: "Port Control Protocol Anycast", spec: "RFC 7723", global: "True"},
	{prefix: pfx("192.0.0.10/32"), name: "Traversal Using Relays around NAT Anycast", spec: "RFC 8155", global: "True"},
	{prefix: pfx("192.0.0.170/32"), name: "NAT64/DNS64 Discovery", spec: "RFC 8880, RFC 7050 section 2.2", global: "False"},
	{prefix: pfx("192.0.0.171/32"), name: "NAT64/DNS64 Discovery", spec: "RFC 8880, RFC 7050 section 2.2", global: "False"},
	{prefix: pfx("192.0.2.0/24"), name: "Documentation (TEST-NET-1)", spec: "RFC 5737", global: "False"},
	{prefix: pfx("192.31.196.0/24"), name: "AS112-v4", spec: "RFC 7535", global: "True"},
	{prefix: pfx("192.52.193.0/24"), name: "AMT", spec: "RFC 7450", global: "True"},
	{prefix: pfx("192.88.99.0/24"), name: "Deprecated (6to4 Relay Anycast)", spec: "RFC 7526", global: ""},
	{prefix: pfx("192.88.99.2/32"), name: "6a44-relay anycast address", spec: "RFC 6751", global: "False"},
	{prefix: pfx("192.168.0.0/16"), name: "Private-Use", spec: "RFC 1918", global: "False"},
	{prefix: pfx("192.175.48.0/24"), name: "Direct Delegation AS112 Service", spec: "RFC 7534", global: "True"},
	{prefix: pfx("198.18.0.0/15"), name: "Benchmarking", spec: "RFC 2544", global: "False"},
	{prefix: pfx("198.51.100.0/24"), name: "Documentation (TEST-NET-2)", spec: "RFC 5737", global: "False"},
	{prefix: pfx("203.0.113.0/24"), name: "Documentation (TEST-NET-3)", spec: "RFC 5737", global: "False"},
	{prefix: pfx("240.0.0.0/4"), name: "Reserved", spec: "RFC 1112, section 4", global: "False"},
	{prefix: pfx("255.255.255.255/32"), name: "Limited Broadcast", spec: "RFC 8190, RFC 919 section 7", global: "False"},
}

// ipv6Special is the IANA IPv6 Special-Purpose Address Registry in full, in its order.
//
// Refused whole, though marked globally reachable: the PCP, TURN and DNS-SD SRP anycast
// addresses, AMT, AS112-v6 and its direct delegation (the same reasons as for IPv4);
// ORCHIDv2 and DETs, which are identifiers, not locators any host answers on.
// 64:ff9b::/96 (NAT64, globally reachable) is only another spelling of an IPv4 address,
// reached through a translator: it is checked by the address it embeds, as are
// IPv4-mapped addresses (the registry's "False" is about packets on the wire; a proxy on
// a dual-stack socket dials the IPv4 address) and 6to4 (2002::/16, "N/A").
// 64:ff9b:1::/48 (NAT64 for local use, not globally reachable) is refused whole: the
// operator picks where its IPv4 address sits (RFC 6052 allows six prefix lengths), so what
// it reaches cannot be checked; its embedded address still names the reason when it is a
// refused one. Teredo (2001::/32, "N/A") is refused whole: it tunnels through relays
// to a client address the proxy cannot check.
var ipv6Special = []block{
	{prefix: pfx("::1/128"), name: "Loopback Address", spec: "RFC 4291", global: "False"},
	{prefix: pfx("::/128"), name: "Unspecified Address", spec: "RFC 4291", global: "False"},
	{prefix: pfx("::ffff:0:0/96"), name: "IPv4-mapped Address", spec: "RFC 4291", global: "False", embeds: low32, reachable: true},
	{prefix: pfx("64:ff9b::/96"), name: "IPv4-IPv6 Translat.", spec: "RFC 6052", global: "True", embeds: low32, reachable: true},
	{prefix: pfx("64:ff9b:1::/48"), name: "IPv4-IPv6 Translat.", spec: "RFC 8215", global: "False", embeds: localNAT64},
	{prefix: pfx("100::/64"), name: "Discard-Only Address Block", spec: "RFC 6666", global: "False"},
	{prefix: pfx("100:0:0:1::/64"), name: "Dummy IPv6 Prefix", spec: "RFC 9780", global: "False"},
	{prefix: pfx("2001::/23"), name: "IETF Protocol Assignments", spec: "RFC 2928", global: "False"},
	{prefix: pfx("2001::/32"), name: "TEREDO", spec: "RFC 4380, RFC 8190", global: "N/A", embeds: teredo},
	{prefix: pfx("2001:1::1/128"), name: "Port Control Protocol Anycast", spec: "RFC 7723", global: "True"},
	{prefix: pfx("2001:1::2/128"), name: "Traversal Using Relays around NAT Anycast", spec: "RFC 8155", global: "True"},
	{prefix: pfx("2001:1::3/128"), name: "DNS-SD Service Registration Protocol Anycast", spec: "RFC 9665", global: "True"},
	{prefix: pfx("2001:2::/48"), name: "Benchmarking", spec: "RFC 5180, RFC Errata 1752", global: "False"},
	{prefix: pfx("2001:3::/32"), name: "AMT", spec: "RFC 7450", global: "True"},
	{prefix: pfx("2001:4:112::/48"), name: "AS112-v6", spec: "RFC 7535", global: "True"},
	{prefix: pfx("2001:10::/28"), name: "Deprecated (previously ORCHID)", spec: "RFC 4843", global: ""},
	{prefix: pfx("2001:20::/28"), name: "ORCHIDv2", spec: "RFC 7343", global: "True"},
	{prefix: pfx("2001:30::/28"), name: "Drone Remote ID Protocol Entity Tags (DETs) Prefix", spec: "RFC 9374", global: "True"},
	{prefix: pfx("2001:db8::/32"), name: "Documentation", spec: "RFC 3849", global: "False"},
	{prefix: pfx("2002::/16"), name: "6to4", spec: "RFC 3056", global: "N/A", embeds: sixToFour, reachable: true},
	{prefix: pfx("2620:4f:8000::/48"), name: "Direct Delegation AS112 Service", spec: "RFC 7534", global: "True"},
	{prefix: pfx("3fff::/20"), name: "Documentation", spec: "RFC 9637", global: "False"},
	{prefix: pfx("5f00::/16"), name: "Segment Routing (SRv6) SIDs", spec: "RFC 9602", global: "False"},
	{prefix: pfx("fc00::/7"), name: "Unique-Local", spec: "RFC 4193, RFC 8190", global: "False"},
	{prefix: pfx("fe80::/10"), name: "Link-Local Unicast", spec: "RFC 4291", global: "False"},
}

// ipv6NotGlobal is every block of the IANA IPv6 Address Space outside 2000::/3, the only
// space assigned for global unicast: no public host has an address in them.
var ipv6NotGlobal = []block{
	{prefix: pfx("::/8"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("100::/8"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("200::/7"), name: "Reserved by IETF", spec: "RFC 4048"},
	{prefix: pfx("400::/6"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("800::/5"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("1000::/4"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("4000::/3"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("6000::/3"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("8000::/3"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("a000::/3"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("c000::/3"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("e000::/4"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("f000::/5"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("f800::/6"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("fe00::/9"), name: "Reserved by IETF", spec: "RFC 3513, RFC 4291"},
	{prefix: pfx("fec0::/10"), name: "Reserved by IETF (deprecated site-local)", spec: "RFC 3879"},
	{prefix: pfx("ff00::/8"), name: "Multicast", spec: "RFC 3513, RFC 4291"},
}

// others are blocks outside the special-purpose registries that Roche refuses too.
var others = []block{
	{prefix: pfx("224.0.0.0/4"), name: "Multicast", spec: "RFC 5771", registry: regMulticast},
	// Deprecated spellings of IPv4 addresses inside ::/8, checked by what they embed and
	// refused whole: nothing routes them.
	{prefix: pfx("::/96"), name: "IPv4-compatible Address (deprecated)", spec: "RFC 4291 section 2.5.5.1", embeds: low32, registry: regRoche},
	{prefix: pfx("::ffff:0:0:0/96"), name: "IPv4-translated Address", spec: "RFC 2765 section 2.1", embeds: low32, registry: regRoche},
}

// A metadataAddr is a cloud provider's instance metadata or credentials endpoint: the
// host's cloud identity, refused even when an allowlist entry names it literally.
type metadataAddr struct {
	addr netip.Addr
	name string
}

// metadataAddrs are refused before anything else. Most also sit in a refused block; they
// are listed to name them in refusals, to refuse them even to an IP-literal entry, and for
// 168.63.129.16, a public address the blocks would let through.
var metadataAddrs = []metadataAddr{
	{netip.MustParseAddr("169.254.169.254"), "instance metadata of AWS, GCP, Azure, OpenStack, Oracle Cloud, IBM Cloud, DigitalOcean, Hetzner and others"},
	{netip.MustParseAddr("169.254.170.2"), "AWS ECS task metadata and credentials"},
	{netip.MustParseAddr("169.254.170.23"), "AWS EKS Pod Identity credentials"},
	{netip.MustParseAddr("169.254.0.23"), "Tencent Cloud metadata"},
	{netip.MustParseAddr("169.254.42.42"), "Scaleway metadata"},
	{netip.MustParseAddr("192.0.0.192"), "Oracle Cloud Classic metadata"},
	{netip.MustParseAddr("100.100.100.200"), "Alibaba Cloud metadata"},
	{netip.MustParseAddr("168.63.129.16"), "Azure WireServer (host agent: VM extension settings and certificates)"},
	{netip.MustParseAddr("fd00:ec2::254"), "AWS instance metadata over IPv6"},
	{netip.MustParseAddr("fd00:ec2::23"), "AWS EKS Pod Identity credentials over IPv6"},
}

// blocks is every block the proxy refuses addresses from (or checks by what they embed).
var blocks = func() []block {
	var all []block
	for _, l := range []struct {
		reg string
		bs  []block
	}{{regIPv4Special, ipv4Special}, {regIPv6Special, ipv6Special}, {regIPv6Space, ipv6NotGlobal}, {"", others}} {
		for _, b := range l.bs {
			if l.reg != "" {
				b.registry = l.reg
			}
			all = append(all, b)
		}
	}
	return all
}()

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// MetadataAddrs returns the cloud metadata addresses Roche refuses, for enforcement
// outside the proxy (the Docker provider's firewall rules for --network).
func MetadataAddrs() []netip.Addr {
	out := make([]netip.Addr, len(metadataAddrs))
	for i, m := range metadataAddrs {
		out[i] = m.addr
	}
	return out
}

// deepest returns the most specific block holding a, if any.
func deepest(a netip.Addr) (block, bool) {
	var best block
	found := false
	for _, b := range blocks {
		if b.prefix.Contains(a) && (!found || b.prefix.Bits() > best.prefix.Bits()) {
			best, found = b, true
		}
	}
	return best, found
}

// low32 is an IPv4 address in the last 32 bits (mapped, compatible, NAT64 /96).
func low32(a netip.Addr) []netip.Addr {
	b := a.As16()
	return []netip.Addr{netip.AddrFrom4([4]byte(b[12:16]))}
}

// sixToFour is 2002:AABB:CCDD::/48, the IPv4 address in bits 16-47 (RFC 3056).
func sixToFour(a netip.Addr) []netip.Addr {
	b := a.As16()
	return []netip.Addr{netip.AddrFrom4([4]byte(b[2:6]))}
}

// teredo carries the server's IPv4 address in bits 32-63 and the client's, inverted, in
// the last 32 bits (RFC 4380 section 4).
func teredo(a netip.Addr) []netip.Addr {
	b := a.As16()
	client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
	return []netip.Addr{netip.AddrFrom4([4]byte(b[4:8])), netip.AddrFrom4(client)}
}

// localNAT64 tries the two places RFC 6052 puts an IPv4 address under a /48: in a /96
// (the last 32 bits) and right after the /48 (bits 48-63 and 72-87, around the u octet).
// An all-zero candidate is where the other spelling leaves nothing, not 0.0.0.0.
func localNAT64(a netip.Addr) []netip.Addr {
	b := a.As16()
	var out []netip.Addr
	for _, v := range []netip.Addr{low32(a)[0], netip.AddrFrom4([4]byte{b[6], b[7], b[9], b[10]})} {
		if !v.IsUnspecified() {
			out = append(out, v)
		}
	}
	return out
}

// checker decides whether the proxy may dial an address.
type checker struct {
	// hostAddrs lists the addresses on this host's interfaces.
	hostAddrs func() ([]netip.Addr, error)
	// hostName names the interface holding a host address, for the refusal message.
	hostName func(netip.Addr) string
}

// refusal says why a may not be dialled, or "" when it may. literal is set when an
// allowlist entry names a as an IP literal: then only a cloud metadata address, bare or
// embedded, is refused, so that an operator can still list a mirror on the host or the LAN.
func (c checker) refusal(a netip.Addr, literal bool) string {
	a = a.WithZone("")
	if literal {
		return metadataRefusal(a)
	}
	own, err := c.hostAddrs()
	if err != nil {
		// Without the list no address can be told apart from the host's own: refuse.
		return fmt.Sprintf("this host's addresses cannot be listed to check %s against them (%v)", a, err)
	}
	return c.check(a, own, 0)
}

func (c checker) check(a netip.Addr, own []netip.Addr, depth int) string {
	if why := metadataRefusal(a); why != "" {
		return why
	}
	b, inBlock := deepest(a)
	if slices.Contains(own, a) {
		why := fmt.Sprintf("%s is an address of this host", a)
		if c.hostName != nil {
			if name := c.hostName(a); name != "" {
				why += " (interface " + name + ")"
			}
		}
		if inBlock && !b.reachable {
			why += ", in " + b.describe()
		}
		return why
	}
	if !inBlock {
		return ""
	}
	if b.embeds != nil && depth == 0 {
		for _, v4 := range b.embeds(a) {
			if why := c.check(v4, own, depth+1); why != "" {
				return fmt.Sprintf("%s embeds the IPv4 address %s (%s, %s): %s", a, v4, b.prefix, b.name, why)
			}
		}
	}
	if b.reachable {
		return ""
	}
	return fmt.Sprintf("%s is in %s", a, b.describe())
}

func (b block) describe() string {
	s := fmt.Sprintf("%s, %s (%s", b.prefix, b.name, b.spec)
	if b.registry != regRoche {
		s += "; " + b.registry
	}
	return s + ")"
}

// metadataRefusal refuses a cloud metadata address, bare or in an IPv6 spelling.
func metadataRefusal(a netip.Addr) string {
	a = a.WithZone("")
	for _, m := range metadataAddrs {
		if a == m.addr {
			return fmt.Sprintf("%s is a cloud metadata address (%s)", a, m.name)
		}
	}
	if b, ok := deepest(a); ok && b.embeds != nil {
		for _, v4 := range b.embeds(a) {
			for _, m := range metadataAddrs {
				if v4 == m.addr {
					return fmt.Sprintf("%s embeds the IPv4 address %s (%s, %s): a cloud metadata address (%s)", a, v4, b.prefix, b.name, m.name)
				}
			}
		}
	}
	return ""
}

// interfaceAddrs reads the addresses of this host's interfaces from the kernel.
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// interfaceName names the interface that holds a, or "".
func interfaceName(a netip.Addr) string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		for _, x := range addrs {
			if n, ok := x.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a {
					return i.Name
				}
			}
		}
	}
	return ""
}
