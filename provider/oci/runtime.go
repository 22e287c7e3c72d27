package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/internal/statedir"
)

// Runtimes the provider drives, fastest first: the default is the first of them that
// runs a probe sandbox on this host.
const (
	RuntimeCrun = "crun"
	RuntimeRunc = "runc"
	// RuntimeRunsc (gVisor) is refused: run bare, it runs the agent, but the sandbox's
	// limits and posture are gVisor's, not what Roche promises (see runscRefusal).
	RuntimeRunsc = "runsc"
)

// Runtimes lists the runtime names WithRuntime takes.
func Runtimes() []string { return []string{RuntimeCrun, RuntimeRunc} }

// autoOrder is what the default tries.
var autoOrder = []string{RuntimeCrun, RuntimeRunc}

// runscRefusal is what was found running the conformance suite on Debian's runsc
// (20221219) as a bare OCI runtime (--network=none --host-uds=create): the host cgroup's
// pids limit counts the sentry's threads, not the sandbox's processes; a memory limit
// kills the whole sandbox instead of one command; io_uring_setup and ptrace are served by
// the sentry (Roche's seccomp profile filters the sentry, not the sandbox); and the
// agent cannot switch file access to the sandbox user (setfsuid).
const runscRefusal = "runsc as a bare OCI runtime does not enforce Roche's limits and posture here (pids and memory limits act on gVisor's sentry, io_uring and ptrace are served inside, the agent's setfsuid fails): use gVisor through the docker provider (--runtime runsc) or the kubernetes provider's RuntimeClass"

// ociRuntime is one OCI runtime binary and the global flags it runs with.
type ociRuntime struct {
	name string
	path string
	root string   // its state directory (--root), Roche's own
	args []string // global flags before the command
	// hideUnified runs it without the cgroup2 mount of a hybrid host (crun, which
	// refuses such hosts; see startWithoutUnified).
	hideUnified bool
	log         *slog.Logger
	// sealed, when set, is a sealed in-memory copy of the binary, run instead of path
	// (see sealBinary). sealMu is read-held while a run starts from it, so that
	// closeSealed cannot close the copy (and its descriptor be reused) under that start.
	sealMu sync.RWMutex
	sealed *os.File
	// seccompBPF is Roche's seccomp filter as crun compiled it for an earlier sandbox,
	// base64 (see learnSeccomp); nil until then, and always for runc.
	seccompBPF atomic.Pointer[string]
	// seccompFile keeps that compilation on disk for the next process, under seccompKey
	// (see loadSeccomp); "" keeps it in this process only.
	seccompFile, seccompKey string

	// Deletes waiting for crun (see deleteBatched), and whether a run is under way.
	delMu      sync.Mutex
	delQueue   []deleteReq
	delRunning bool
}

// deleteReq is one container's delete, waiting to go in a batch.
type deleteReq struct {
	id   string
	done chan error
}

func (r *ociRuntime) command(ctx context.Context, args ...string) runtimeCmd {
	full := append(append([]string{"--root", r.root}, r.args...), args...)
	cmd := exec.CommandContext(ctx, r.path, full...)
	cmd.Args[0] = r.name
	return runtimeCmd{Cmd: cmd, rt: r}
}

// closeSealed closes the sealed copy; runs that start afterwards use the binary's file
// (lease teardowns may still run the runtime after the provider is closed).
func (r *ociRuntime) closeSealed() {
	r.sealMu.Lock()
	defer r.sealMu.Unlock()
	if r.sealed != nil {
		r.sealed.Close()
		r.sealed = nil
	}
}

// crunSeccompBPF is crun's annotation for a seccomp filter compiled already: crun loads
// it as it is instead of compiling config.json's filter with libseccomp, which took
// ~2.5 ms of the ~20 ms of CPU a sandbox's start costs crun here. It replaces that filter
// entirely, so Roche only ever hands crun its own compilation of the same filter.
const crunSeccompBPF = "run.oci.seccomp_bpf_data"

// maxSeccompBPF is the largest filter the kernel loads: 4096 instructions of 8 bytes.
const maxSeccompBPF = 4096 * 8

// compiledSeccomp is the filter to hand the runtime compiled (crunSeccompBPF), or "".
func (r *ociRuntime) compiledSeccomp() string {
	if p := r.seccompBPF.Load(); p != nil {
		return *p
	}
	return ""
}

// learnSeccomp keeps the filter crun compiled for the sandbox id, which it leaves in the
// container's state directory (for execs) before it returns from run, so that later
// sandboxes are handed it compiled. Every sandbox has the same filter (seccompFilter),
// and the state directory is Roche's own, out of every sandbox's reach.
func (r *ociRuntime) learnSeccomp(id string) {
	if r.name != RuntimeCrun || r.seccompBPF.Load() != nil {
		return
	}
	b, err := os.ReadFile(filepath.Join(r.root, id, "seccomp.bpf"))
	if err != nil || !validBPF(b) {
		r.log.Debug("crun's compiled seccomp filter is not usable; it compiles it for every sandbox", "id", id, "bytes", len(b), "err", err)
		return
	}
	s := base64.StdEncoding.EncodeToString(b)
	if r.seccompBPF.CompareAndSwap(nil, &s) {
		r.saveSeccomp(b)
	}
}

// forgetSeccomp drops the compiled filter, after a run of the runtime failed: the next
// sandbox compiles it again, and so does the next process.
func (r *ociRuntime) forgetSeccomp() {
	r.seccompBPF.Store(nil)
	if r.seccompFile != "" {
		os.Remove(r.seccompFile)
	}
}

// The compiled filter on disk. Each process that runs sandboxes (roche run, one per
// command, with no roched) would otherwise have crun compile the filter with libseccomp
// for its first sandbox; the compilation is kept in the state directory instead, under
// a key of everything it depends on: the runtime binary (path, size and mtime), how it
// runs (hideUnified), the kernel (libseccomp picks what it emits by the kernel it runs
// on) and the filter itself. The state directory is on /run, so a reboot clears it; a
// libseccomp upgraded without one keeps the older compilation of the same filter. The
// entry carries its own digest, so that a torn or corrupted file is seen and compiled
// again, and it is read only when no one but root could have written it (statedir.ReadPrivate):
// a planted entry would replace Roche's filter in every sandbox.

// seccompEntry is the file's content.
type seccompEntry struct {
	Key    string `json:"key"`
	SHA256 string `json:"sha256"` // of the filter's bytes
	BPF    string `json:"bpf"`    // base64
}

// maxSeccompEntry bounds the file: the largest filter in base64, and the rest.
const maxSeccompEntry = maxSeccompBPF*4/3 + 4096

// seccompKey is the cache key of Roche's filter compiled by r, "" when it cannot be made.
func seccompKey(r *ociRuntime) string {
	f, err := seccompFilter()
	if err != nil {
		return ""
	}
	js, err := json.Marshal(f)
	if err != nil {
		return ""
	}
	h := sha256.New()
	osRelease, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	osVersion, _ := os.ReadFile("/proc/sys/kernel/version")
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%v\x00%s\x00%s\x00", r.name, r.path, binaryStamp(r.path), r.hideUnified,
		bytes.TrimSpace(osRelease), bytes.TrimSpace(osVersion))
	h.Write(js)
	return hex.EncodeToString(h.Sum(nil))
}

// validBPF: a whole number of instructions, no more than the kernel loads.
func validBPF(b []byte) bool { return len(b) > 0 && len(b)%8 == 0 && len(b) <= maxSeccompBPF }

// loadSeccomp sets up the disk cache of crun's compiled filter under the state directory
// and takes the compilation found there when its key matches and it is whole; one that
// is stale or damaged is left to be replaced by the next compilation.
func (p *Provider) loadSeccomp(r *ociRuntime) {
	if r.name != RuntimeCrun {
		return
	}
	key := seccompKey(r)
	if key == "" {
		return
	}
	r.seccompFile, r.seccompKey = filepath.Join(p.stateDir, "seccomp-"+r.name+".json"), key
	b, err := statedir.ReadPrivate(r.seccompFile, maxSeccompEntry)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Warn("ignoring the compiled seccomp filter on disk; crun compiles it again", "file", r.seccompFile, "err", err)
		}
		return
	}
	var e seccompEntry
	if err := json.Unmarshal(b, &e); err != nil || e.Key != key {
		p.log.Debug("the compiled seccomp filter on disk is stale; crun compiles it again", "file", r.seccompFile, "err", err)
		return
	}
	bpf, err := base64.StdEncoding.DecodeString(e.BPF)
	if sum := sha256.Sum256(bpf); err != nil || !validBPF(bpf) || hex.EncodeToString(sum[:]) != e.SHA256 {
		p.log.Warn("the compiled seccomp filter on disk is damaged; crun compiles it again", "file", r.seccompFile, "bytes", len(bpf), "err", err)
		return
	}
	s := base64.StdEncoding.EncodeToString(bpf)
	r.seccompBPF.Store(&s)
}

// saveSeccomp keeps crun's compilation bpf on disk for the next process.
func (r *ociRuntime) saveSeccomp(bpf []byte) {
	if r.seccompFile == "" {
		return
	}
	sum := sha256.Sum256(bpf)
	b, err := json.Marshal(seccompEntry{Key: r.seccompKey, SHA256: hex.EncodeToString(sum[:]), BPF: base64.StdEncoding.EncodeToString(bpf)})
	if err == nil {
		err = statedir.WritePrivate(r.seccompFile, b)
	}
	if err != nil {
		r.log.Debug("keeping the compiled seccomp filter on disk", "file", r.seccompFile, "err", err)
	}
}

// runtimeCmd is one run of the runtime: an exec.Cmd whose Start, and so Run, Output and
// CombinedOutput, run the sealed copy while there is one and honour hideUnified.
type runtimeCmd struct {
	*exec.Cmd
	rt *ociRuntime
}

func (c runtimeCmd) Start() error {
	c.rt.sealMu.RLock()
	defer c.rt.sealMu.RUnlock()
	if c.rt.sealed != nil {
		c.Path = fmt.Sprintf("/proc/self/fd/%d", c.rt.sealed.Fd())
	}
	if c.rt.hideUnified {
		return startWithoutUnified(c.Cmd)
	}
	return c.Cmd.Start()
}

func (c runtimeCmd) Run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.Wait()
}

// Output is exec.Cmd.Output: stdout, with stderr in the *exec.ExitError.
func (c runtimeCmd) Output() ([]byte, error) {
	var out, stderr bytes.Buffer
	c.Stdout, c.Stderr = &out, &stderr
	err := c.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		ee.Stderr = stderr.Bytes()
	}
	return out.Bytes(), err
}

// CombinedOutput is exec.Cmd.CombinedOutput.
func (c runtimeCmd) CombinedOutput() ([]byte, error) {
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	return out.Bytes(), err
}

// run runs the runtime and returns its output, or an error quoting it.
func (r *ociRuntime) run(ctx context.Context, args ...string) ([]byte, error) {
	out, err := r.command(ctx, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %v: %s", r.name, args[0], err, lastLine(out))
	}
	return out, nil
}

// containerState is what `RUNTIME list --format json` says of one container.
type containerState struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Pid     int    `json:"pid"`
	Created string `json:"created"`
}

// list returns the runtime's containers by id.
func (r *ociRuntime) list(ctx context.Context) (map[string]containerState, error) {
	out, err := r.command(ctx, "list", "--format", "json").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%s list: %v: %s", r.name, err, lastLine(ee.Stderr))
		}
		return nil, fmt.Errorf("%s list: %w", r.name, err)
	}
	var cs []containerState
	if s := bytes.TrimSpace(out); len(s) > 0 && string(s) != "null" {
		if err := json.Unmarshal(s, &cs); err != nil {
			return nil, fmt.Errorf("%s list: %w", r.name, err)
		}
	}
	m := make(map[string]containerState, len(cs))
	for _, c := range cs {
		m[c.ID] = c
	}
	return m, nil
}

// state returns one container's state; ok is false when the runtime does not know it.
func (r *ociRuntime) state(ctx context.Context, id string) (containerState, bool) {
	out, err := r.command(ctx, "state", id).Output()
	if err != nil {
		return containerState{}, false
	}
	var st containerState
	if json.Unmarshal(out, &st) != nil {
		return containerState{}, false
	}
	return st, true
}

// remove kills and deletes a container; one the runtime does not know is not an error.
// With runc, pidFile, when given, names the container's init (written by run
// --pid-file): its exit is then awaited here, on a pidfd, after the runtime's own kill,
// and a plain delete follows, which is faster than delete --force (runc polls for the
// exit there). The pid is never signalled directly, so a pid reused meanwhile costs a
// bounded wait, nothing else. crun's delete --force waits for the exit itself, in one
// run of the runtime instead of two, and deletes several containers in that run
// (deleteBatched).
func (r *ociRuntime) remove(ctx context.Context, id, pidFile string) error {
	if r.name == RuntimeCrun {
		return r.deleteBatched(ctx, id)
	}
	if pid := readPid(pidFile); pid > 0 {
		if wait, ok := exitWaiter(pid); ok {
			if _, err := r.command(ctx, "kill", id, "KILL").CombinedOutput(); err == nil && wait(2*time.Second) {
				if _, err := r.command(ctx, "delete", id).CombinedOutput(); err == nil {
					return nil
				}
			} else {
				wait(0)
			}
		}
	}
	return r.deleteOne(ctx, id)
}

// deleteOne runs delete --force for one container.
func (r *ociRuntime) deleteOne(ctx context.Context, id string) error {
	out, err := r.command(ctx, "delete", "--force", id).CombinedOutput()
	if err != nil && !notExist(out) {
		if _, known := r.state(ctx, id); known {
			return fmt.Errorf("%s delete %s: %v: %s", r.name, id, err, lastLine(out))
		}
	}
	return nil
}

// maxDeleteBatch bounds the containers one run of crun deletes.
const maxDeleteBatch = 16

// deleteBatched deletes a container with crun, together with the others whose deletes
// arrive while a run is under way: the next run takes them all (delete --force --regex
// matching exactly their ids). A run of crun costs ~3 ms of CPU here before it does
// anything (its dynamic loading), which a batch pays once: under a load of destroys that
// is a sixth of what each cycle spent in crun. One delete arriving alone runs at once,
// as before. A batch that fails is retried one container at a time, so that each
// destroy gets its own error.
func (r *ociRuntime) deleteBatched(ctx context.Context, id string) error {
	req := deleteReq{id: id, done: make(chan error, 1)}
	r.delMu.Lock()
	r.delQueue = append(r.delQueue, req)
	start := !r.delRunning
	r.delRunning = true
	r.delMu.Unlock()
	if start {
		go r.runDeletes()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%s delete %s: %w", r.name, id, ctx.Err())
	}
}

// runDeletes runs batches until none is waiting.
func (r *ociRuntime) runDeletes() {
	for {
		r.delMu.Lock()
		n := min(len(r.delQueue), maxDeleteBatch)
		batch := r.delQueue[:n:n]
		r.delQueue = r.delQueue[n:]
		if n == 0 {
			r.delRunning = false
			r.delMu.Unlock()
			return
		}
		r.delMu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if len(batch) == 1 {
			batch[0].done <- r.deleteOne(ctx, batch[0].id)
			cancel()
			continue
		}
		ids := make([]string, len(batch))
		for i, d := range batch {
			ids[i] = regexp.QuoteMeta(d.id)
		}
		out, err := r.command(ctx, "delete", "--force", "--regex", "^("+strings.Join(ids, "|")+")$").CombinedOutput()
		r.log.Debug("deleted containers in one run", "runtime", r.name, "n", len(batch), "err", err, "out", lastLine(out))
		for _, d := range batch {
			if err == nil {
				d.done <- nil
			} else {
				d.done <- r.deleteOne(ctx, d.id)
			}
		}
		cancel()
	}
}

// readPid reads a pid file; 0 when there is none.
func readPid(file string) int {
	if file == "" {
		return 0
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

func notExist(out []byte) bool {
	s := string(out)
	return strings.Contains(s, "does not exist") || strings.Contains(s, "not found") || strings.Contains(s, "No such file")
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	// runc logs as logfmt: keep the message.
	if _, msg, ok := strings.Cut(s, `msg="`); ok {
		s = strings.TrimSuffix(msg, `"`)
	}
	return s
}

// findRuntime finds name's binary in PATH or the sbin directories a daemon's PATH may
// lack.
func findRuntime(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin", "/usr/local/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed (apt-get install %s)", name, name)
}

func (p *Provider) newRuntime(name string) (*ociRuntime, error) {
	path, err := findRuntime(name)
	if err != nil {
		return nil, err
	}
	return &ociRuntime{name: name, path: path, root: filepath.Join(p.stateDir, "runtime", name),
		hideUnified: name == RuntimeCrun && hybridCgroups(), log: p.log}, nil
}

// probeFile records, per runtime binary, whether it ran the probe sandbox, so that the
// probe runs once per boot (the state directory is on /run) and binary, not per process.
type probeResult struct {
	Binary string        `json:"binary"`
	Stamp  string        `json:"stamp"` // size and mtime of the binary
	Err    string        `json:"err,omitempty"`
	Took   time.Duration `json:"took"`
}

func binaryStamp(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d-%d", fi.Size(), fi.ModTime().UnixNano())
}

// resolveRuntime picks the runtime: the one asked for (WithRuntime), checked by the probe,
// else the first of autoOrder that passes it. Each refusal is one line in the error.
func (p *Provider) resolveRuntime(ctx context.Context) (*ociRuntime, error) {
	p.rtMu.Lock()
	defer p.rtMu.Unlock()
	if p.rt != nil {
		return p.rt, nil
	}
	if err := os.MkdirAll(p.stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: making the state directory: %v", roche.ErrUnavailable, err)
	}
	if mounted, err := stateOnTmpfs(ctx, p.stateDir); err != nil {
		p.log.Warn("keeping the state directory on its filesystem", "dir", p.stateDir, "err", err)
	} else if mounted {
		p.log.Info("mounted a tmpfs for the state directory (its filesystem was not one)", "dir", p.stateDir)
	}
	names := autoOrder
	if p.runtimeName != "" {
		names = []string{p.runtimeName}
	}
	var why []string
	for _, name := range names {
		r, err := p.newRuntime(name)
		if err == nil {
			err = p.probe(ctx, r)
		}
		if err != nil {
			why = append(why, name+": "+err.Error())
			if p.runtimeName == "" {
				p.log.Info("OCI runtime not usable here; trying the next", "runtime", name, "err", err)
			}
			continue
		}
		p.loadSeccomp(r)
		if f, err := sealBinary(r.path); err == nil {
			r.sealed = f
		} else {
			p.log.Info("running the OCI runtime from its file, not a sealed copy", "runtime", name, "err", err)
		}
		p.rt = r
		return r, nil
	}
	if p.runtimeName != "" {
		return nil, fmt.Errorf("%w: OCI runtime %s does not work on this host (%s): leave --oci-runtime unset to use one that does",
			roche.ErrUnavailable, p.runtimeName, strings.Join(why, "; "))
	}
	return nil, fmt.Errorf("%w: no OCI runtime works on this host (%s); install runc (apt-get install runc)",
		roche.ErrUnavailable, strings.Join(why, "; "))
}

// probe runs roche-agent --version in a throwaway sandbox with the namespaces and cgroup
// limits real ones get, once per runtime binary and boot.
func (p *Provider) probe(ctx context.Context, r *ociRuntime) error {
	file := filepath.Join(p.stateDir, "probe-"+r.name+".json")
	stamp := binaryStamp(r.path)
	if r.hideUnified {
		stamp += "-hybrid" // a verdict from before the runtime ran that way does not hold
	}
	var known probeResult
	if b, err := statedir.ReadPrivate(file, 64<<10); err == nil && json.Unmarshal(b, &known) == nil && known.Binary == r.path && known.Stamp == stamp {
		if known.Err != "" {
			return errors.New(known.Err)
		}
		return nil
	}
	start := time.Now()
	err := p.runProbe(ctx, r)
	res := probeResult{Binary: r.path, Stamp: stamp, Took: time.Since(start)}
	if err != nil {
		if ctx.Err() != nil {
			return err // not the runtime's fault: do not record it
		}
		res.Err = err.Error()
	}
	if b, merr := json.Marshal(res); merr == nil {
		_ = statedir.WritePrivate(file, b)
	}
	p.log.Info("probed OCI runtime", "runtime", r.name, "ok", err == nil, "took", res.Took.Round(time.Millisecond), "err", err)
	return err
}

func (p *Provider) runProbe(ctx context.Context, r *ociRuntime) error {
	if p.agentPath == "" {
		return errors.New("roche-agent was not found, and the probe runs it")
	}
	dir, err := os.MkdirTemp(p.stateDir, "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "rootfs")
	// The mount points too: crun, unlike runc, does not make /dev.
	for _, d := range []string{".roche", "dev", "proc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(root, agentspec.Binary), nil, 0o755); err != nil {
		return err
	}
	id := "roche-probe-" + randomHex(4)
	mem, pids := int64(64<<20), int64(16)

	s := &specs.Spec{
		Version: specVersion,
		Root:    &specs.Root{Path: root},
		Process: &specs.Process{Args: []string{agentspec.Binary, "--version"}, Cwd: "/", NoNewPrivileges: true,
			Env: []string{"PATH=/"}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: agentspec.Binary, Type: "bind", Source: p.agentPath, Options: []string{"bind", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
			},
			CgroupsPath: "/roche-" + id,
			Resources:   &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &mem, Swap: &mem}, Pids: &specs.LinuxPids{Limit: pids}},
		},
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := r.command(pctx, "run", "--bundle", dir, id).CombinedOutput()
	_ = r.remove(context.WithoutCancel(ctx), id, "")
	if err != nil {
		return fmt.Errorf("a probe sandbox failed: %v: %s", err, lastLine(out))
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return errors.New("a probe sandbox printed nothing, not roche-agent's version")
	}
	return nil
}
