package faults

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"
	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// privateDockerd is a dockerd of this test's own, beside the shared one, so that it can
// be stopped and started again without disturbing anyone else: its own data and exec
// roots (and so its own containerd), its own socket, pid file and (empty) config file,
// no bridge and no iptables rules (Roche's sandboxes have no network by default), and
// its own network namespace: a dockerd started with --bridge=none deletes the host's
// docker0 interface, which the shared dockerd's default network needs.
type privateDockerd struct {
	dir   string
	host  string   // unix://DIR/d.sock
	links []string // the host's network interfaces before it started
	cmd   *exec.Cmd
	log   *syncBuffer
	done  chan struct{} // closed when cmd has exited
}

// startPrivateDockerd starts a dockerd of the test's own, loaded with the test image,
// and stops it and removes everything it made when the test ends.
func startPrivateDockerd(t *testing.T) *privateDockerd {
	t.Helper()
	dir := shortDir(t)
	d := &privateDockerd{dir: dir, host: "unix://" + filepath.Join(dir, "d.sock"), log: &syncBuffer{}, links: hostLinks(t)}
	if err := os.WriteFile(filepath.Join(dir, "daemon.json"), []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.cleanup(t) })
	d.start(t)
	// The engine's own image store is empty: the test image comes from the shared one.
	load := exec.Command("sh", "-c", "docker save "+testenv.Image()+" | docker -H "+d.host+" load")
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("loading %s into the private dockerd: %v\n%s", testenv.Image(), err, out)
	}
	return d
}

func (d *privateDockerd) args() []string {
	return []string{
		"--data-root", filepath.Join(d.dir, "data"),
		"--exec-root", filepath.Join(d.dir, "exec"),
		"--pidfile", filepath.Join(d.dir, "d.pid"),
		"--config-file", filepath.Join(d.dir, "daemon.json"),
		"-H", d.host,
		"--bridge=none", "--iptables=false", "--ip-masq=false", "--ip6tables=false",
		"--storage-driver", "overlay2",
	}
}

// start starts dockerd and waits until it answers.
func (d *privateDockerd) start(t *testing.T) {
	t.Helper()
	// A dockerd killed outright takes its containerd with it, a moment later; the next
	// one starts its own, which cannot open the store while the old one still holds it.
	if pid := d.containerdPID(); pid > 0 {
		eventually(t, 30*time.Second, "the last dockerd's containerd to exit", func() bool { return d.containerdPID() == 0 })
	}
	// unshare execs dockerd, which keeps its pid, in a new network namespace.
	d.cmd = exec.Command("unshare", append([]string{"--net", "--", "dockerd"}, d.args()...)...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	// Its own session: a signal meant for the test never reaches it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("starting a private dockerd: %v", err)
	}
	d.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		close(done)
	}(d.cmd, d.done)
	c, err := dockerclient.NewClientWithOpts(dockerclient.WithHost(d.host), dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eventually(t, 60*time.Second, "the private dockerd to answer", func() bool {
		select {
		case <-d.done:
			t.Fatalf("the private dockerd exited: %s", d.log.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Ping(ctx)
		return err == nil
	})
}

// stop sends dockerd sig (by its pid) and waits for it to exit. With SIGTERM, as its
// service manager stops it, it stops its containers first; with SIGKILL they run on
// under their shims, and its containerd with them, until the next dockerd starts.
func (d *privateDockerd) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if d.cmd == nil {
		return
	}
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("stopping the private dockerd: %v", err)
	}
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		t.Fatalf("the private dockerd did not exit within 60 s of %v", sig)
	}
	d.cmd = nil
}

// pid is the running dockerd's pid (unshare execs dockerd, which keeps it).
func (d *privateDockerd) pid() int { return d.cmd.Process.Pid }

// client is an Engine API client of this dockerd.
func (d *privateDockerd) client(t *testing.T) *dockerclient.Client {
	t.Helper()
	c, err := dockerclient.NewClientWithOpts(dockerclient.WithHost(d.host), dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cleanup stops dockerd (killing it and its containerd if SIGTERM is not enough), then
// unmounts what is left under its roots and removes them.
func (d *privateDockerd) cleanup(t *testing.T) {
	if d.cmd != nil {
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(60 * time.Second):
			d.cmd.Process.Kill()
			<-d.done
		}
		d.cmd = nil
	}
	// dockerd stops the containerd it started; one left by a dockerd that was killed is
	// found by its pid file and its name.
	if pid := d.containerdPID(); pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, m := range mountsUnder(d.dir) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", m, err)
		}
	}
	if err := os.RemoveAll(d.dir); err != nil {
		t.Errorf("removing the private dockerd's roots: %v", err)
	}
	// The agent directories of this engine's sandboxes, under the state directory every
	// engine on the host shares by default: a sandbox its engine removed while nobody
	// watched keeps its directory until a later sweep on the same engine, which never
	// comes once the engine is gone. Only this engine's directory: it names its address.
	if err := os.RemoveAll(d.agentRoot()); err != nil {
		t.Errorf("removing the private dockerd's agent directories: %v", err)
	}
	if left := mountsUnder(d.dir); len(left) > 0 {
		t.Errorf("mounts left under %s: %v", d.dir, left)
	}
	now := hostLinks(t)
	for _, l := range d.links {
		if !slices.Contains(now, l) {
			t.Errorf("the host's network interface %s went while the private dockerd ran", l)
		}
	}
	if t.Failed() {
		t.Logf("private dockerd log:\n%s", d.log.String())
	}
}

// agentRoot is where provider/docker keeps the agent directories of this engine's
// sandboxes under the default state directory.
func (d *privateDockerd) agentRoot() string { return agentRootOf(d.host) }

// agentRootOf is provider/docker's agentRootOf under the default state directory: the
// engine's address, hashed.
func agentRootOf(host string) string {
	sum := sha256.Sum256([]byte(host))
	return filepath.Join("/run/roche/docker", "engine-"+hex.EncodeToString(sum[:6]))
}

// containerdPID is the pid of the containerd this dockerd started, if it runs, else 0.
func (d *privateDockerd) containerdPID() int {
	b, err := os.ReadFile(filepath.Join(d.dir, "exec", "containerd", "containerd.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "containerd" {
		return 0
	}
	return pid
}

// hostLinks lists the names of the host's network interfaces, but the veth ends other
// processes' containers come and go with.
func hostLinks(t *testing.T) []string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifs {
		if !strings.HasPrefix(i.Name, "veth") {
			names = append(names, i.Name)
		}
	}
	return names
}

// mountsUnder lists the mount points below dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			out = append(out, f[1])
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}
