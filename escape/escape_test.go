package escape

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/providertest"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

//go:embed probe.py
var probe string

var update = flag.Bool("update", false, "rewrite docs/escapes.md from what this run saw")

func TestMain(m *testing.M) {
	// The qemu provider runs each VM's supervisor as this test binary.
	supervisor.RunIfAsked()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	cleanup, err := testenv.SetupAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	code := m.Run()
	if err := removeAgentImage(); err != nil {
		fmt.Fprintln(os.Stderr, "removing the agent image from the test cluster:", err)
		code = 1
	}
	return code
}

// seen is what the run observed, by column and key, for the table.
var (
	seenMu sync.Mutex
	seen   = map[string]map[string]string{}
)

// TestEscapes runs every case against every column, then checks the table in docs.
func TestEscapes(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker, testenv.Cluster, testenv.QEMU, testenv.PythonWasm)
	for _, col := range columns {
		t.Run(col.name, func(t *testing.T) {
			obs := attack(t, col)
			seenMu.Lock()
			seen[col.name] = obs
			seenMu.Unlock()
			if os.Getenv("ROCHE_ESCAPE_DUMP") != "" {
				b, _ := json.MarshalIndent(obs, "", "  ")
				t.Logf("observations:\n%s", b)
			}
			for _, c := range cases {
				v := c.judge(col.name, obs)
				h, known := holeOf(c.id, col.name)
				switch {
				case v.status == "OPEN" && known:
					t.Logf("%s: a known hole, still open: %s (%s)", c.id, h.why, v.detail)
				case v.status == "OPEN":
					t.Errorf("%s: the attack got through: %s", c.id, v.detail)
				case v.status == "UNEXPECTED":
					t.Errorf("%s: stopped for a reason the suite does not name, or not tried: %s", c.id, v.detail)
				case known:
					t.Errorf("%s is listed in knownHoles (%s) but was %s: take it off the list", c.id, h.why, v.cell)
				}
			}
		})
	}
	checkTable(t)
}

// attack runs every step against one column and returns what each attempt met.
func attack(t *testing.T, col column) map[string]string {
	p, cfg := col.open(t)
	h := &harness{t: t, p: p, cfg: cfg, col: col}
	obs := map[string]string{}
	before := viewHost()
	a := h.create(cfg)
	b := h.create(cfg)
	maps.Copy(obs, h.probe(a))
	h.workdirs(a, obs)
	h.localUser(before, []string{a, b}, obs)
	h.neighbours(a, b, obs)
	h.races(a, obs)
	h.exhaust(a, b, obs)
	return obs
}

type harness struct {
	t   *testing.T
	p   roche.Provider
	cfg roche.Config
	col column
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox destroyed when the test ends.
func (h *harness) create(cfg roche.Config) string {
	h.t.Helper()
	info, err := kit.Create(ctxFor(h.t, 3*time.Minute), h.p, cfg, owned)
	if err != nil {
		h.t.Fatalf("Create: %v", err)
	}
	h.t.Cleanup(func() {
		if err := h.p.Destroy(context.Background(), info.ID); err != nil {
			h.t.Errorf("Destroy %s: %v", info.ID, err)
		}
	})
	return info.ID
}

// python runs the probe in mode with args in sandbox id and returns its JSON answer.
func (h *harness) python(id, mode string, args any) map[string]string {
	h.t.Helper()
	res := h.exec(id, probeCmd(mode, args), 5*time.Minute)
	out := map[string]string{}
	if err := json.Unmarshal([]byte(lastLine(res.Stdout)), &out); err != nil {
		h.t.Fatalf("the probe (%s) answered %q (exit %d, stderr %q): %v", mode, res.Stdout, res.ExitCode, res.Stderr, err)
	}
	return out
}

func (h *harness) exec(id string, cmd []string, timeout time.Duration) roche.ExecResult {
	h.t.Helper()
	res, err := h.p.Exec(ctxFor(h.t, timeout+time.Minute), id, roche.ExecRequest{Cmd: cmd, Timeout: timeout})
	if err != nil {
		h.t.Fatalf("Exec %q: %v", cmd[:min(len(cmd), 3)], err)
	}
	return res
}

func probeCmd(mode string, args any) []string {
	b, _ := json.Marshal(args)
	return []string{"python3", "-c", probe, mode, string(b)}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// probe runs every in-sandbox attempt in sandbox id.
func (h *harness) probe(id string) map[string]string {
	args := map[string]any{
		"host_addrs":     hostAddrs(h.t),
		"metadata_addrs": metadataAddrs,
		"cluster_addrs":  clusterAddrs(),
		"loopback_ports": loopbackPorts(h.t),
	}
	obs := h.python(id, "probe", args)
	if h.col.name == cQEMU && obs["socket.vsock"] == "ok:socket made" {
		// The QEMU guest has no vsock device (its agent is on the serial line): the
		// socket is made and reaches nothing.
		obs["socket.vsock"] = "nosurface: no vsock device in the guest"
	}
	obs["pids.promise"] = pidsPromise(obs["pids.max"], obs["pids.nproc"], h.cfg.PidsLimit)
	return obs
}

// metadataAddrs are the cloud metadata services docs/network.md names.
var metadataAddrs = []string{"169.254.169.254", "169.254.170.2", "169.254.170.23", "169.254.0.23",
	"169.254.42.42", "192.0.0.192", "100.100.100.200", "168.63.129.16", "fd00:ec2::254", "fd00:ec2::23"}

// clusterAddrs are the test cluster's node (its API server and kubelet) and its
// in-cluster API service address, where the cluster is up.
func clusterAddrs() []string {
	out := []string{"10.96.0.1"}
	if cluster != nil && cluster.NodeIP != "" {
		out = append(out, cluster.NodeIP)
	}
	return out
}

// loopbackPorts are the TCP ports the host listens on at 127.0.0.1 or any address: a
// sandbox sharing the host's loopback would reach them.
func loopbackPorts(t *testing.T) []int {
	var ports []int
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fl := strings.Fields(line)
			if len(fl) < 4 || fl[3] != "0A" { // LISTEN
				continue
			}
			addr, port, _ := strings.Cut(fl[1], ":")
			if addr != "0100007F" && strings.Trim(addr, "0") != "" && addr != "00000000000000000000000001000000" {
				continue
			}
			n, err := strconv.ParseInt(port, 16, 32)
			if err == nil && !slices.Contains(ports, int(n)) {
				ports = append(ports, int(n))
			}
		}
	}
	slices.Sort(ports)
	if len(ports) > 20 {
		ports = ports[:20]
	}
	return ports
}

// workdirs: CVE-2024-21626's workdir half from the API: a command asked to start in
// /proc/self/fd/N, where a leaked descriptor of the runtime would put it on the host.
func (h *harness) workdirs(id string, obs map[string]string) {
	var answers []string
	add := func(a string) {
		if !slices.Contains(answers, a) {
			answers = append(answers, a)
		}
	}
	for n := 3; n <= 9; n++ {
		dir := fmt.Sprintf("/proc/self/fd/%d", n)
		res, err := h.p.Exec(ctxFor(h.t, 2*time.Minute), id, roche.ExecRequest{
			Cmd: []string{"python3", "-c", "import os; print(os.getcwd())"}, Workdir: dir, Timeout: time.Minute})
		switch {
		case err != nil:
			add("refused: " + sentinel(err))
		case res.ExitCode == 0:
			add(fmt.Sprintf("ok:started in %s, cwd %s", dir, strings.TrimSpace(res.Stdout)))
		default:
			add(errnoIn(res.Stderr))
		}
	}
	slices.Sort(answers)
	obs["fd.workdir"] = strings.Join(answers, ",")
}

// sentinel names the roche error a refusal wraps.
func sentinel(err error) string {
	for _, s := range []error{roche.ErrInvalidConfig, roche.ErrNotFound, roche.ErrPermission, roche.ErrUnsupported} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return err.Error()
}

// errnoIn finds the errno a failed start reported ("no such file or directory").
func errnoIn(stderr string) string {
	for text, name := range map[string]string{
		"no such file or directory": "ENOENT", "not a directory": "ENOTDIR",
		"permission denied": "EACCES", "operation not permitted": "EPERM",
	} {
		if strings.Contains(strings.ToLower(stderr), text) {
			return name
		}
	}
	return "exit: " + strings.TrimSpace(stderr)
}

// hold starts the probe in mode in sandbox id, waits for its first line and returns it
// with a stop function that ends the program (and everything it started).
func (h *harness) hold(id, mode string, args any) (string, func()) {
	h.t.Helper()
	line, stop, err := h.tryHold(id, mode, args)
	if err != nil {
		h.t.Fatal(err)
	}
	return line, stop
}

// tryHold is hold, returning why the program could not be held.
func (h *harness) tryHold(id, mode string, args any) (string, func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	w := providertest.NewLineWriter()
	done := make(chan error, 1)
	go func() {
		res, err := h.p.Exec(ctx, id, roche.ExecRequest{Cmd: probeCmd(mode, args), Timeout: 10 * time.Minute, Stdout: w})
		if err == nil && res.ExitCode != 0 && ctx.Err() == nil {
			err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		done <- err
	}()
	stop := func() {
		cancel()
		<-done
	}
	select {
	case line := <-w.Line():
		return line, stop, nil
	case err := <-done:
		cancel()
		return "", nil, fmt.Errorf("the probe's %s ended before it was ready: %w", mode, err)
	case <-time.After(5 * time.Minute):
		stop()
		return "", nil, fmt.Errorf("the probe's %s printed nothing within 5 minutes", mode)
	}
}

// neighbours: sandbox a leaves traces (a process, files in /tmp and /dev/shm, a System
// V segment, an abstract unix socket) and b looks for each.
func (h *harness) neighbours(a, b string, obs map[string]string) {
	tok := fmt.Sprintf("%x", time.Now().UnixNano())
	args := map[string]any{"token": tok, "shm_key": 0x5eed0000 + int(time.Now().UnixNano()%0xffff)}
	line, stop := h.hold(a, "mark", args)
	defer stop()
	if !strings.HasPrefix(line, "ready "+tok) {
		h.t.Fatalf("sandbox A could not leave its traces: %q", line)
	}
	maps.Copy(obs, h.python(b, "look", args))
}

// exhaust: sandbox a takes all it may of each shared kernel resource and holds it; b,
// its neighbour, must still get some. An answer "ok: ..." is the neighbour starved.
func (h *harness) exhaust(a, b string, obs map[string]string) {
	caps := map[string]int{"nofile": 200000, "inodes": 100000, "inotify": 10000, "watches": 250000, "shm_mib": 256, "pids": 500}
	if h.col.lean {
		caps = map[string]int{"nofile": 20000, "inodes": 5000, "inotify": 1000, "watches": 20000, "shm_mib": 256, "pids": 200}
	}
	if h.col.hostFiles {
		// Past the entry quota of a host directory's /tmp (65,536), or a count reached
		// without a refusal is the host's inodes taken.
		caps["inodes"] = 100000
	}
	// Two rounds: what the kernel counts per file and user, then processes, which on
	// gVisor may end the whole sandbox rather than be refused (docs/providers/docker.md, gVisor).
	files := maps.Clone(caps)
	files["pids"] = 0
	held, got := h.hogRound(a, b, files, func() {
		h.exec(a, []string{"python3", "-c", "import os, shutil; shutil.rmtree('/tmp/roche-inodes', True); [os.remove(f) for f in ('/dev/shm/roche-fill', '/tmp/roche-nofile') if os.path.exists(f)]"}, 2*time.Minute)
	})
	procs := map[string]int{"pids": caps["pids"]}
	for _, k := range []string{"nofile", "inodes", "inotify", "watches", "shm_mib"} {
		procs[k] = 0
	}
	if ph, pg, ended := h.hogRoundMayEnd(a, b, procs); ended {
		held["pids"], got["pids"] = "ENDED", h.python(b, "neighbour", nil)["pids"]
	} else {
		held["pids"], got["pids"] = ph["pids"], pg["pids"]
	}
	if h.col.name == cRunsc && (held["pids"] == "ENDED" || strings.HasPrefix(held["pids"], "EAGAIN")) {
		// Either, by chance (docs/providers/docker.md, gVisor): one answer, so the table does not flap.
		h.t.Logf("the pids hog on gVisor: %s", held["pids"])
		held["pids"] = "contained"
	}
	for _, k := range []string{"pids", "nofile", "inodes", "inotify", "inotify_watches", "shm"} {
		hog, nb := held[k], got[k]
		switch {
		case strings.HasPrefix(hog, "nosurface"):
			obs["exhaust."+k] = hog
		case nb != "ok" && !strings.HasPrefix(nb, "nosurface"):
			obs["exhaust."+k] = fmt.Sprintf("ok:the neighbour got %s while A held %s", nb, hog)
		default:
			// What stopped A: an errno, the suite's cap ("cap"), or ENDED: A's own
			// sandbox ended.
			obs["exhaust."+k] = strings.Fields(hog)[0]
		}
	}
	// Files in a directory of the host's own filesystem: a count reached without a
	// refusal is the host's inodes, shared with every neighbour.
	if f := strings.Fields(held["inodes"]); h.col.hostFiles && len(f) == 2 && f[0] == "cap" {
		obs["exhaust.inodes"] = fmt.Sprintf("ok:%s empty files made in the host directory behind /tmp without a refusal", f[1])
	}
	// A bound on open files: past 65536 in one process, two sandboxes could take the
	// host's table (the audit saw 1.2 million from one).
	if f := strings.Fields(held["nofile"]); len(f) >= 2 && !h.col.ownKernel {
		if n, _ := strconv.Atoi(f[1]); f[0] != "EMFILE" || n > 65536 {
			obs["exhaust.nofile"] = fmt.Sprintf("ok:%s files open in one process without a bound (%s)", f[1], held["nofile"])
		}
	}
	// A guest's open files are descriptors of the provider's own process (this test
	// binary, as roched would be): they stay bounded while A holds all it may.
	if n, err := strconv.Atoi(held["host_fds"]); h.col.hostFiles && err == nil && n > 2*roche.DefaultOpenFiles {
		obs["exhaust.nofile"] = fmt.Sprintf("ok:the provider's process holds %d more descriptors while A holds its files (%s)", n, held["nofile"])
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// hogRound runs the hog with caps in a and the neighbour's probe in b while it holds,
// then stops it and runs clean.
func (h *harness) hogRound(a, b string, caps map[string]int, clean func()) (held, got map[string]string) {
	fds := openFDs(h.t)
	line, stop := h.hold(a, "hog", map[string]any{"caps": caps})
	defer func() {
		stop()
		clean()
	}()
	held = map[string]string{}
	if err := json.Unmarshal([]byte(line), &held); err != nil {
		h.t.Fatalf("the hog answered %q: %v", line, err)
	}
	if h.col.hostFiles {
		// The descriptors this process gained while A holds what it took.
		held["host_fds"] = strconv.Itoa(openFDs(h.t) - fds)
	}
	h.t.Logf("sandbox A holds: %v", held)
	return held, h.python(b, "neighbour", nil)
}

// hogRoundMayEnd is hogRound where the hog may end its own sandbox, on gVisor: then
// ended is true, once the sandbox is confirmed gone.
func (h *harness) hogRoundMayEnd(a, b string, caps map[string]int) (held, got map[string]string, ended bool) {
	line, stop, err := h.tryHold(a, "hog", map[string]any{"caps": caps})
	if err != nil {
		if h.col.name != cRunsc || !errors.Is(err, roche.ErrNotFound) {
			h.t.Fatalf("the hog: %v", err)
		}
		if info, ierr := h.p.Inspect(ctxFor(h.t, time.Minute), a); ierr == nil && info.State == roche.StateRunning {
			h.t.Fatalf("the hog: %v, yet its sandbox still runs", err)
		}
		h.t.Logf("the pids hog ended its own gVisor sandbox: %v", err)
		return nil, nil, true
	}
	defer stop()
	held = map[string]string{}
	if err := json.Unmarshal([]byte(line), &held); err != nil {
		h.t.Fatalf("the hog answered %q: %v", line, err)
	}
	h.t.Logf("sandbox A holds: %v", held)
	return held, h.python(b, "neighbour", nil), false
}

// pidsPromise: the PID limit a program reads is the one the config asks, whether the
// pids cgroup says it (where visible and set) or RLIMIT_NPROC does (the agent holds the
// sandbox user to it, the cgroup then only the host's ceiling, masked).
func pidsPromise(pidsMax, nproc string, limit int) string {
	want := strconv.Itoa(limit)
	_, numeric := strconv.Atoi(pidsMax)
	switch {
	case numeric == nil && pidsMax != want:
		return fmt.Sprintf("ok:pids.max reads %s where the config asks %s", pidsMax, want)
	case pidsMax == want:
		return "pids.max"
	case nproc == want:
		return "nproc"
	case strings.HasPrefix(nproc, "nosurface"):
		return nproc
	}
	return fmt.Sprintf("ok:no limit of %s to read: pids.max %q, RLIMIT_NPROC %q", want, pidsMax, nproc)
}
