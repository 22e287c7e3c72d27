package docker_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// controlProbeEnv makes the test binary the second local user's probe (controlProbe).
const controlProbeEnv = "ROCHE_TEST_CONTROL_PROBE"

// controlTarget is one sandbox the probe attacks.
type controlTarget struct {
	ID        string // the container's id, which runsc names its sandbox by
	RunscRoot string // runsc's state directory (--root), for a sandbox on gVisor
	AgentDir  string // the host directory of its agent's socket
	Victim    string // where its read-write mount is, inside the sandbox
}

// controlProbeIn is what the test hands the probe.
type controlProbeIn struct {
	Targets []controlTarget
	Runsc   string   // the runsc binary dockerd runs
	Dirs    []string // run directories to search for sockets
}

// controlReport is what the probe found: every socket it tried and how that ended
// ("connected" or the error), and the attempts to run a command through runsc.
type controlReport struct {
	Sockets map[string]string // name ("@abstract" or a path) -> outcome
	Walk    map[string]string // run directory -> why the walk stopped, if it did
	URPC    map[string]string // control socket address -> outcome of the exec call
	Exec    map[string]string // container id -> runsc exec's outcome
}

// TestLocalUserCannotReachSandboxControl: a second, unprivileged local user (made by
// the test) tries every way it can find to a sandbox's control channel, on runc and on
// gVisor: every unix socket the kernel lists (/proc/net/unix: abstract ones, which no
// file mode protects, and named ones) and every socket under the run directories of
// Roche, dockerd and containerd; a raw call of runsc's control protocol
// (containerManager.ExecuteAsync as uid 0 with every capability, which once gave any
// local user a root shell in a --runtime runsc sandbox and, through its read-write
// mount, a setuid-root file on the host); and runsc exec with the sandbox's --root.
// Every one must fail, for the reason asserted, and the victim directory stay empty.
func TestLocalUserCannotReachSandboxControl(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	name, uid, gid := testenv.LocalUser(t, "rc")

	// The harmless victim: a host directory mounted read-write into each sandbox.
	dir, err := os.MkdirTemp("", "rctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	victim := filepath.Join(dir, "victim")
	if err := os.Mkdir(victim, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(victim, 0o777)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dc := engineClient(t)
	in := controlProbeIn{Dirs: []string{"/run/roche", "/run/docker", "/run/containerd", "/var/run/docker.sock", "/run/docker.sock"}}
	for _, rt := range []string{docker.RuntimeRunc, docker.RuntimeGVisor} {
		p := newProvider(t, docker.WithRuntime(rt), docker.WithEgressProxy())
		cfg := testConfig()
		cfg.Mounts = []roche.Mount{{Source: victim, Target: "/victim", ReadWrite: true}}
		cfg.NetworkAllowlist = []string{"example.com"} // an egress proxy socket too
		id := sandbox(t, p, cfg)
		c, err := dc.ContainerInspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		// The sockets are in the run/ subdirectory of the sandbox's directory.
		target := controlTarget{ID: c.ID, AgentDir: filepath.Join(c.Config.Labels[docker.LabelAgentDir], c.Config.Labels[docker.LabelRunDir]), Victim: "/victim"}
		if rt == docker.RuntimeGVisor {
			target.RunscRoot = runscRoot(t, c.ID)
			// Not vacuous: the control socket is where the probe will look (a file today,
			// an abstract name in older runsc), and root reaches it.
			file := filepath.Join(target.RunscRoot, "runsc-"+c.ID+".sock")
			reached := false
			for _, addr := range []string{file, "@runsc-sandbox." + c.ID + "\x00"} {
				if conn, err := dialUnix(addr); err == nil {
					conn.Close()
					reached = true
				}
			}
			if !reached {
				t.Fatalf("root cannot reach the sandbox's control socket (%s) either: the probe would prove nothing", file)
			}
			in.Dirs = append(in.Dirs, target.RunscRoot)
		}
		in.Targets = append(in.Targets, target)
	}
	in.Runsc = registeredRunsc(t)

	// The test binary, where the other user can run it.
	bin := filepath.Join(dir, "bin")
	os.Mkdir(bin, 0o755)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(bin, "docker.test")
	if err := os.WriteFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	arg, _ := json.Marshal(in)
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = []string{controlProbeEnv + "=" + string(arg), "PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the probe as %s: %v\n%s", name, err, stderr.String())
	}
	var rep controlReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("the probe's report %q: %v", out, err)
	}

	ids := make([]string, 0, len(in.Targets))
	for _, tg := range in.Targets {
		ids = append(ids, tg.ID)
	}
	for sock, outcome := range rep.Sockets {
		control := isControlSocket(sock, ids, in.Dirs)
		t.Logf("%s: %s (a sandbox's or engine's control socket: %v)", sock, outcome, control)
		if control && outcome == "connected" {
			t.Errorf("user %s connected to %s", name, sock)
		}
	}
	for d, why := range rep.Walk {
		t.Logf("walking %s stopped: %s", d, why)
	}
	for _, tg := range in.Targets {
		// The agent's socket and the egress proxy's: behind a directory only the
		// creating user may enter.
		for _, s := range []string{"agent.sock", "egress.sock"} {
			// The probe cannot list the directory: it tries the path it was told.
			sock := filepath.Join(tg.AgentDir, s)
			if got := rep.Sockets[sock]; !strings.Contains(got, "permission denied") {
				t.Errorf("user %s connecting to %s: %q, want permission denied", name, sock, got)
			}
		}
		if tg.RunscRoot == "" {
			continue
		}
		// runsc's control protocol: the socket is a file root owns in a directory
		// others may only pass through; the abstract name of older runsc is not there.
		file := filepath.Join(tg.RunscRoot, "runsc-"+tg.ID+".sock")
		if got := rep.URPC[file]; !strings.Contains(got, "permission denied") {
			t.Errorf("user %s calling runsc's control server at %s: %q, want permission denied", name, file, got)
		}
		abstract := "@runsc-sandbox." + tg.ID + "@"
		if got := rep.URPC[abstract]; !strings.Contains(got, "connection refused") {
			t.Errorf("user %s calling runsc's control server at the abstract %s: %q, want connection refused (no such socket)", name, abstract, got)
		}
		// runsc exec finds no sandbox: the user may not read its state directory.
		if got := rep.Exec[tg.ID]; got == "ok" || !strings.Contains(got, "does not exist") {
			t.Errorf("user %s running runsc --root %s exec %s: %q, want a refusal (it cannot load the sandbox's state)", name, tg.RunscRoot, tg.ID, got)
		}
		if got := rep.Walk[tg.RunscRoot]; !strings.Contains(got, "permission denied") {
			t.Errorf("user %s reading runsc's state directory %s: %q, want permission denied", name, tg.RunscRoot, got)
		}
	}
	entries, _ := os.ReadDir(victim)
	for _, e := range entries {
		fi, _ := e.Info()
		t.Errorf("the victim directory holds %s (%v): a sandbox's control channel was reached", e.Name(), fi.Mode())
	}
}

// runscRoot finds runsc's state directory of sandbox id from its processes' --root.
func runscRoot(t *testing.T, id string) string {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte(id)) {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i, a := range args {
			if a == "--root" && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, "--root="); ok {
				return v
			}
		}
	}
	t.Fatalf("no runsc process of sandbox %s names its --root", id)
	return ""
}

// registeredRunsc is the runsc binary dockerd runs for the runtime runsc.
func registeredRunsc(t *testing.T) string {
	t.Helper()
	info, err := engineClient(t).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rt, ok := info.Runtimes[docker.RuntimeGVisor]
	if !ok || rt.Path == "" {
		t.Fatalf("dockerd has no runtime %s: %s", docker.RuntimeGVisor, docker.RegisterRunscHint)
	}
	return rt.Path
}

// isControlSocket says whether a socket the probe found is a sandbox's, a runtime's or
// the engine's: named after a sandbox or a runtime, or under the run directories.
func isControlSocket(sock string, ids, dirs []string) bool {
	for _, id := range ids {
		if strings.Contains(sock, id) || strings.Contains(sock, id[:12]) {
			return true
		}
	}
	for _, w := range []string{"runsc", "roche", "containerd", "docker"} {
		if strings.Contains(sock, w) {
			return true
		}
	}
	for _, d := range dirs {
		if sock == d || strings.HasPrefix(sock, d+"/") {
			return true
		}
	}
	return false
}

// controlProbe runs as the second local user: it tries every socket it can find and
// runsc's control protocol, and prints a controlReport.
func controlProbe(arg string) int {
	var in controlProbeIn
	if err := json.Unmarshal([]byte(arg), &in); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if os.Getuid() == 0 || os.Geteuid() == 0 {
		fmt.Fprintln(os.Stderr, "the probe runs as root: it would prove nothing")
		return 1
	}
	rep := controlReport{Sockets: map[string]string{}, Walk: map[string]string{}, URPC: map[string]string{}, Exec: map[string]string{}}
	// Every socket the kernel lists in this network namespace.
	if f, err := os.Open("/proc/net/unix"); err == nil {
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 8 {
				name := fields[7]
				rep.Sockets[name] = dialAny(name)
			}
		}
		f.Close()
	}
	// Every socket under the run directories, as far as this user may walk.
	for _, d := range in.Dirs {
		err := filepath.WalkDir(d, func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				if path == d {
					return err
				}
				rep.Walk[path] = err.Error()
				return nil
			}
			if e.Type()&fs.ModeSocket != 0 {
				rep.Sockets[path] = dialAny(path)
			}
			return nil
		})
		if err != nil {
			rep.Walk[d] = err.Error()
		}
	}
	for _, tg := range in.Targets {
		// The sockets this user cannot list but may know the names of.
		for _, s := range []string{"agent.sock", "egress.sock"} {
			path := filepath.Join(tg.AgentDir, s)
			rep.Sockets[path] = dialAny(path)
		}
		if tg.RunscRoot == "" {
			continue
		}
		// runsc's control protocol, by hand: today's file, and older runsc's abstract
		// name (with its trailing NUL).
		file := filepath.Join(tg.RunscRoot, "runsc-"+tg.ID+".sock")
		rep.URPC[file] = urpcExec(file, tg)
		abstract := "@runsc-sandbox." + tg.ID + "@"
		rep.URPC[abstract] = urpcExec("@runsc-sandbox."+tg.ID+"\x00", tg)
		// And runsc itself, with the sandbox's state directory.
		cmd := exec.Command(in.Runsc, "--root", tg.RunscRoot, "exec", "--user", "0:0", tg.ID,
			"/bin/sh", "-c", "touch "+tg.Victim+"/runsc-exec")
		out, err := cmd.CombinedOutput()
		if err == nil {
			rep.Exec[tg.ID] = "ok"
		} else {
			rep.Exec[tg.ID] = fmt.Sprintf("%v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	b, _ := json.Marshal(rep)
	os.Stdout.Write(b)
	return 0
}

// dialAny connects to a unix socket by the name /proc/net/unix shows (an abstract name
// starts with @, where the kernel's NULs show as @ too), as a stream, a packet or a
// datagram socket, and says how it ended.
func dialAny(name string) string {
	addr := name
	if strings.HasPrefix(name, "@") {
		addr = "@" + strings.ReplaceAll(name[1:], "@", "\x00")
	}
	outcome := ""
	for _, network := range []string{"unix", "unixpacket", "unixgram"} {
		outcome = dialOutcome(network, addr)
		if !strings.Contains(outcome, "protocol wrong type") {
			return outcome
		}
	}
	return outcome
}

func dialOutcome(network, addr string) string {
	c, err := dialUnixAs(network, addr)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return errno.Error()
		}
		return err.Error()
	}
	c.Close()
	return "connected"
}

// urpcExec calls containerManager.ExecuteAsync on a runsc control socket: a shell as uid
// 0 with every capability, which leaves a setuid-root copy of itself in the sandbox's
// read-write mount.
func urpcExec(addr string, tg controlTarget) string {
	c, err := dialUnix(addr)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return errno.Error()
		}
		return err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	all := ^uint64(0) >> (64 - 41)
	call := map[string]any{"method": "containerManager.ExecuteAsync", "arg": map[string]any{
		"Filename": "/bin/sh",
		"Argv":     []string{"/bin/sh", "-c", "cp /bin/sh " + tg.Victim + "/pwned && chmod 4755 " + tg.Victim + "/pwned"},
		"Envv":     []string{"PATH=/usr/bin:/bin"}, "WorkingDirectory": "/",
		"KUID": 0, "KGID": 0, "ContainerID": tg.ID,
		"Capabilities": map[string]any{"PermittedCaps": all, "InheritableCaps": all, "EffectiveCaps": all, "BoundingCaps": all},
	}}
	if err := json.NewEncoder(c).Encode(call); err != nil {
		return "connected; sending: " + err.Error()
	}
	var res struct {
		Success bool   `json:"success"`
		Err     string `json:"err"`
	}
	if err := json.NewDecoder(io.LimitReader(c, 1<<20)).Decode(&res); err != nil {
		return "connected; reading: " + err.Error()
	}
	return fmt.Sprintf("connected; success %v %s", res.Success, res.Err)
}

func dialUnix(addr string) (net.Conn, error) { return dialUnixAs("unix", addr) }

// dialUnixAs connects to a unix socket; a path too long for a socket address (runsc's
// control socket, named after the 64-digit container id, is one) is reached through its
// directory's descriptor, as runsc itself does.
func dialUnixAs(network, addr string) (net.Conn, error) {
	if !strings.HasPrefix(addr, "@") && len(addr) >= 108 {
		dir, err := os.OpenFile(filepath.Dir(addr), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, err
		}
		defer dir.Close()
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(addr))
	}
	return net.DialTimeout(network, addr, 2*time.Second)
}
