package docker

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// checkFirewall says why this process cannot keep the host's firewall rules, before
// anything is made.
func (p *Provider) checkFirewall() error {
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Errorf("this process runs as uid %d, and changing the host's iptables rules needs root", uid)
	}
	for _, rs := range []firewallRules{ipv4Rules(), ipv6Rules()} {
		for _, tool := range []string{rs.save, rs.load} {
			if _, err := exec.LookPath(p.firewallTool(tool)); err != nil {
				return fmt.Errorf("%s is missing (apt-get install iptables): %v", tool, err)
			}
		}
	}
	return nil
}

// ensureFirewall installs the rules of both address families when they are missing or
// differ, in one iptables-restore transaction per family, and reads them back.
func (p *Provider) ensureFirewall() error {
	// The rules only mean something where the bridge is: an engine on another machine,
	// in a VM or rootless keeps it out of this network namespace.
	if _, err := net.InterfaceByName(BridgeName); err != nil {
		return fmt.Errorf("the Docker network %s has no bridge %s on this host (a remote, VM or rootless engine), so this host's firewall cannot guard it: %v",
			NetworkName, BridgeName, err)
	}
	for _, rs := range []firewallRules{ipv4Rules(), ipv6Rules()} {
		if err := p.ensureFamily(rs); err != nil {
			return err
		}
	}
	return nil
}

func (p *Provider) ensureFamily(rs firewallRules) error {
	if rs.family == "IPv6" {
		if _, err := os.Stat("/proc/net/if_inet6"); errors.Is(err, os.ErrNotExist) {
			return nil // the kernel has no IPv6: nothing to filter
		}
	}
	for attempt := 1; ; attempt++ {
		t, err := p.readFilterTable(rs)
		if err != nil {
			return err
		}
		script := rs.plan(t)
		if script == "" {
			if attempt > 1 {
				p.log.Info("installed host firewall rules for sandboxes with a network", "family", rs.family, "bridge", BridgeName)
			}
			return nil
		}
		if attempt == 3 {
			return fmt.Errorf("the %s rules do not read back as written: what %s prints differs from what Roche wrote (%s)",
				rs.family, rs.save, strings.Join(strings.Split(strings.TrimSpace(script), "\n"), "; "))
		}
		// A failed transaction changes nothing (say, a hook rule another program removed
		// meanwhile): read the table again and retry once.
		if out, err := p.runTool(rs.load, script, "-w", "--noflush"); err != nil && attempt == 2 {
			return fmt.Errorf("installing the %s rules with %s: %v: %s", rs.family, rs.load, err, bytes.TrimSpace(out))
		}
	}
}

func (p *Provider) readFilterTable(rs firewallRules) (filterTable, error) {
	out, err := p.runTool(rs.save, "", "-t", "filter")
	if err != nil {
		return filterTable{}, fmt.Errorf("reading the %s filter table with %s: %v: %s", rs.family, rs.save, err, bytes.TrimSpace(out))
	}
	t, err := parseFilterTable(string(out))
	if err != nil {
		return t, fmt.Errorf("reading the %s filter table with %s: %v", rs.family, rs.save, err)
	}
	return t, nil
}

func (p *Provider) firewallTool(name string) string {
	if p.firewallDir != "" {
		return filepath.Join(p.firewallDir, name)
	}
	return name
}

func (p *Provider) runTool(name, stdin string, args ...string) ([]byte, error) {
	cmd := exec.Command(p.firewallTool(name), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// lockNetwork serialises the network and firewall set-up between Roche processes on the
// host (roched, CLIs), so that two of them never insert the same hook twice.
func (p *Provider) lockNetwork() (unlock func(), err error) {
	if err := os.MkdirAll(p.stateDir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(p.stateDir, "network.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
