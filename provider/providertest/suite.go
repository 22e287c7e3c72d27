// Package providertest is the conformance suite every Roche provider runs against its
// real backend. Each check runs a small Python program inside the sandbox and asserts
// what that program observed from the inside: security claims are verified where the
// untrusted code lives, not inferred from the configuration that was sent.
//
// Checks that cannot apply to a backend are chosen by its Capabilities (a WASM module
// has no /proc, no fork and no capabilities) and by the optional interfaces it implements
// (roche.WorkspaceManager, roche.Resetter, roche.Snapshotter), never skipped for
// convenience.
package providertest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Options configures the suite for one provider.
type Options struct {
	// Config is the base sandbox config (image and all); each check starts from a copy.
	// It must pass Validate.
	Config roche.Config
	// Python is the argv that runs the Python interpreter inside the sandbox;
	// nil means ["python3"].
	Python []string
	// Owner, when set, is the owner the provider must report for the suite's sandboxes
	// whatever owner they are created for (roched sets its own); empty means the owner
	// given (kit.CreateOptions) must come back.
	Owner string
	// NoDiskLimit, when set, says why the provider refuses a disk limit on a writable
	// root (its backend has no way to fail writes with ENOSPC past it): the DiskLimit
	// check then expects that refusal, ErrUnsupported naming "disk", and nothing made.
	// Config.Disk must then be "0" for the writable checks.
	NoDiskLimit string
	// GVisor says the sandbox runs on gVisor's user-space kernel (runsc), whose
	// processes are not host processes: the privilege checks then assert what gVisor
	// enforces instead, a fork bomb that ends the whole sandbox counts as contained, and
	// another process's /proc/PID/fdinfo, which gVisor lists (docs/providers/docker.md says so), is
	// logged rather than refused.
	GVisor bool
	// PidsExact says the provider holds a sandbox's programs to exactly PidsLimit
	// processes and threads and that every limit a program may read says so
	// (RLIMIT_NPROC, /proc/self/limits, its pids cgroup if it shows one): roche-agent's
	// --nproc, and a pids cgroup that is only the host's ceiling, hidden (the docker
	// provider's limits.go shows how).
	PidsExact bool
	// VM says the sandbox is a microVM: its memory limit is the guest's RAM, its kernel's
	// share included, and a guest cgroup keeps the agent's memory apart from the
	// commands', so under a small limit a program filling the tmpfs mounts may be
	// OOM-killed before they are full, the agent unharmed.
	VM bool
	// ScratchMountsLackNosuid, when set, says why the backend mounts /tmp and /dev/shm
	// without nosuid and nodev (Kubernetes' emptyDir tmpfs has neither): the mount check
	// then asserts that they are absent and that no device node can be made there.
	ScratchMountsLackNosuid string
	// HostPIDs, when set, returns the host's pids of sandbox id's processes (where they
	// are host processes; for a microVM, its hypervisor's, whose memory maps the
	// guest's): the egress check then reads their environments and memory from the host
	// for the secret it brokers.
	HostPIDs func(id string) ([]int, error)
}

// Run runs the conformance suite against p.
func Run(t *testing.T, p roche.Provider, opts Options) {
	if err := opts.Config.Validate(); err != nil {
		t.Fatalf("suite config: %v", err)
	}
	if opts.Python == nil {
		opts.Python = []string{"python3"}
	}
	s := &suite{p: p, opts: opts, caps: p.Capabilities()}
	t.Cleanup(func() {
		s.checkNothingLeaked(t)
		s.checkNothingKept(t)
	})

	// The sandbox most checks share lives an hour: the suite takes ~3 min on a quiet
	// machine with QEMU emulating, and took 9.5 on a loaded one, past the default
	// lifetime of 300 s, which then ended it mid-suite.
	sharedCfg := opts.Config
	if sharedCfg.TimeoutSecs > 0 && sharedCfg.TimeoutSecs < 3600 {
		sharedCfg.TimeoutSecs = 3600
	}
	shared := s.create(t, sharedCfg)
	t.Run("Hello", func(t *testing.T) { s.testHello(t, shared) })
	t.Run("ExitCodeAndStderr", func(t *testing.T) { s.testExitCode(t, shared) })
	t.Run("Env", s.testEnv)
	t.Run("Stdin", func(t *testing.T) { s.testStdin(t, shared) })
	t.Run("StreamsOutputAsProduced", func(t *testing.T) { s.testStreaming(t, shared) })
	t.Run("ReadOnlyRoot", func(t *testing.T) { s.testReadOnlyRoot(t, shared) })
	t.Run("Writable", s.testWritable)
	t.Run("DiskLimit", s.testDiskLimit)
	t.Run("Workdir", s.testWorkdir)
	t.Run("TimeoutStopsBusyLoop", func(t *testing.T) { s.testTimeout(t, shared) })
	t.Run("OutputTruncated", func(t *testing.T) { s.testTruncated(t, shared) })
	t.Run("MemoryLimit", s.testMemoryLimit)
	t.Run("NoDockerSocket", func(t *testing.T) { s.testNoDockerSocket(t, shared) })
	t.Run("EmptyCommand", func(t *testing.T) { s.testEmptyCommand(t, shared) })
	t.Run("InvalidConfigLeavesNothing", s.testInvalidConfig)
	t.Run("UnsupportedConfigRefused", s.testUnsupported)
	t.Run("UnknownSandbox", s.testUnknownSandbox)
	t.Run("ListAndDestroy", s.testListAndDestroy)
	if s.caps.Files {
		t.Run("CopyFiles", s.testCopyFiles)
	}
	if s.caps.Pause {
		t.Run("PauseUnpause", s.testPause)
	}
	if s.caps.Mounts {
		t.Run("Mounts", s.testMounts)
	}
	if s.caps.Processes {
		t.Run("LinuxPrivileges", func(t *testing.T) { s.testPrivileges(t, shared) })
		t.Run("KernelAttackSurface", func(t *testing.T) { s.testKernelAttackSurface(t, shared) })
		t.Run("OtherProcessesOpaque", func(t *testing.T) { s.testOtherProcesses(t, shared) })
		t.Run("MknodRefused", func(t *testing.T) { s.testMknod(t, shared) })
		t.Run("OpenFilesBounded", func(t *testing.T) { s.testOpenFiles(t, shared) })
		t.Run("User", s.testUser)
		t.Run("HomeWritable", func(t *testing.T) { s.testHome(t, shared) })
		t.Run("PerUserLimitsNotShared", s.testPerUserLimits)
		t.Run("OOMThroughTmpfs", s.testOOMThroughTmpfs)
		t.Run("NetworkOffOnlyLoopback", func(t *testing.T) { s.testNetworkOff(t, shared) })
		t.Run("TmpCapped", func(t *testing.T) { s.testTmpCapped(t, shared) })
		t.Run("ScratchMountFlags", func(t *testing.T) { s.testScratchMounts(t, shared) })
		t.Run("TimeoutKillsTreeIgnoringSIGTERM", s.testTimeoutKillsTree)
		t.Run("ZombiesReaped", func(t *testing.T) { s.testZombiesReaped(t, shared) })
		t.Run("Receipt", func(t *testing.T) { s.testReceipt(t, shared) })
		t.Run("PidsLimit", s.testPidsLimit)
		if s.opts.PidsExact {
			t.Run("PidsLimitExact", s.testPidsExact)
		}
		t.Run("ForkBomb", s.testForkBomb)
		t.Run("YesTruncatedAndTimedOut", func(t *testing.T) { s.testYes(t, shared) })
	}
	if len(s.caps.Code) > 0 {
		t.Run("Code", s.testCode)
	}
	if s.caps.Network {
		t.Run("NetworkOn", s.testNetworkOn)
	}
	if s.caps.Egress {
		t.Run("EgressAllowlist", s.testEgress)
		t.Run("EgressInterceptAndSecrets", s.testEgressIntercept)
	}
	if s.caps.Files {
		// Each in a sandbox of its own, last: the race takes a while, and the shared
		// sandbox above must not outlive its lifetime waiting for it.
		t.Run("CopyOutBoundary", s.testCopyOutBoundary)
		t.Run("CopyCapAndHoles", s.testCopyCapAndHoles)
		if s.caps.Mounts {
			t.Run("CopyInRace", s.testCopyInRace)
		}
		if s.caps.Processes {
			t.Run("CopyNoSpace", s.testCopyNoSpace)
		}
		t.Run("FilesAPI", s.testFilesAPI)
		t.Run("FilesWatch", s.testFilesWatch)
		if s.caps.Processes {
			t.Run("FilesAttacks", s.testFilesAttacks)
		}
	}
	if _, ok := p.(roche.Terminal); ok && s.caps.Processes {
		t.Run("Terminal", func(t *testing.T) { s.testTerminal(t, shared) })
	}
	if _, ok := p.(roche.BackgroundRunner); ok && s.caps.Processes {
		t.Run("DurableCommands", func(t *testing.T) { s.testDurableCommands(t, shared) })
	} else {
		t.Run("NoDurableCommands", func(t *testing.T) { s.testNoDurableCommands(t, shared) })
	}
	if _, ok := p.(roche.WorkspaceManager); ok {
		t.Run("WorkspacePersists", s.testWorkspace)
		t.Run("WorkspaceSize", s.testWorkspaceSize)
	}
	if _, ok := p.(roche.Resetter); ok {
		t.Run("Reset", s.testReset)
	}
	if _, ok := p.(roche.Snapshotter); ok {
		t.Run("Snapshot", s.testSnapshot)
	}
	if _, ok := p.(kit.Claimer); ok {
		t.Run("Claim", s.testClaim)
	}
	t.Run("Metadata", s.testMetadata)
	if _, ok := p.(roche.LifetimeSetter); ok {
		t.Run("SetTimeout", s.testSetTimeout)
	} else {
		t.Logf("%s: no SetTimeout (roche.LifetimeSetter): a sandbox lives out the lifetime it was made with", p.Name())
	}
}

type suite struct {
	p    roche.Provider
	opts Options
	caps roche.Capabilities

	mu         sync.Mutex
	created    []string
	workspaces []string // names the suite made, to be gone at its end
	snapshots  []string
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox that is destroyed when the test ends.
func (s *suite) create(t *testing.T, cfg roche.Config) string {
	t.Helper()
	return s.createFor(t, cfg, kit.CreateOptions{})
}

// createFor is create with options, as roched, the CLI and a pool create (kit.Create).
func (s *suite) createFor(t *testing.T, cfg roche.Config, opts kit.CreateOptions) string {
	t.Helper()
	info, err := kit.Create(ctxFor(t, 2*time.Minute), s.p, cfg, opts)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if info.ID == "" {
		t.Fatal("Create returned an empty id")
	}
	s.mu.Lock()
	s.created = append(s.created, info.ID)
	s.mu.Unlock()
	t.Cleanup(func() {
		if err := s.p.Destroy(context.Background(), info.ID); err != nil {
			t.Errorf("Destroy %s: %v", info.ID, err)
		}
	})
	return info.ID
}

// py runs a Python program in the sandbox.
func (s *suite) py(t *testing.T, id, code string, mod ...func(*roche.ExecRequest)) roche.ExecResult {
	t.Helper()
	req := roche.ExecRequest{Cmd: append(append([]string{}, s.opts.Python...), "-c", code), Timeout: time.Minute}
	for _, m := range mod {
		m(&req)
	}
	res, err := s.p.Exec(ctxFor(t, 3*time.Minute), id, req)
	if err != nil {
		t.Fatalf("Exec %q: %v", code, err)
	}
	return res
}

// pyOK runs a Python program that must exit 0 and returns its stdout without the final newline.
func (s *suite) pyOK(t *testing.T, id, code string, mod ...func(*roche.ExecRequest)) string {
	t.Helper()
	res := s.py(t, id, code, mod...)
	if res.ExitCode != 0 || res.TimedOut {
		t.Fatalf("program exited %d (timed out %v)\nprogram: %s\nstdout: %s\nstderr: %s", res.ExitCode, res.TimedOut, code, res.Stdout, res.Stderr)
	}
	return strings.TrimRight(res.Stdout, "\n")
}

func withTimeout(d time.Duration) func(*roche.ExecRequest) {
	return func(r *roche.ExecRequest) { r.Timeout = d }
}

func (s *suite) testHello(t *testing.T, id string) {
	res := s.py(t, id, "print('hello')")
	if res.ExitCode != 0 || res.Stdout != "hello\n" || res.Stderr != "" {
		t.Fatalf("got exit %d stdout %q stderr %q, want 0 \"hello\\n\" \"\"", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res.TimedOut || res.Truncated || res.OOMKilled {
		t.Fatalf("flags set on a plain hello: %+v", res)
	}
	if res.Duration <= 0 {
		t.Fatalf("Duration %v, want > 0", res.Duration)
	}
}

func (s *suite) testExitCode(t *testing.T, id string) {
	res := s.py(t, id, "import sys; print('out'); print('oops', file=sys.stderr); sys.exit(3)")
	if res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "oops\n" {
		t.Fatalf("got exit %d stdout %q stderr %q, want 3 \"out\\n\" \"oops\\n\"", res.ExitCode, res.Stdout, res.Stderr)
	}
}

func (s *suite) testEnv(t *testing.T) {
	cfg := s.opts.Config
	cfg.Env = map[string]string{"ROCHE_FROM_CONFIG": "config value", "ROCHE_OVERRIDDEN": "config"}
	id := s.create(t, cfg)
	got := s.pyOK(t, id, "import os; print(os.environ.get('ROCHE_FROM_CONFIG'), os.environ.get('ROCHE_FROM_EXEC'), os.environ.get('ROCHE_OVERRIDDEN'), sep='|')",
		func(r *roche.ExecRequest) {
			r.Env = map[string]string{"ROCHE_FROM_EXEC": "exec value", "ROCHE_OVERRIDDEN": "exec"}
		})
	if want := "config value|exec value|exec"; got != want {
		t.Fatalf("env seen inside: %q, want %q", got, want)
	}
}

func (s *suite) testStdin(t *testing.T, id string) {
	if !s.caps.Stdin {
		t.Skip("provider does not pass stdin (Capabilities.Stdin is false)")
	}
	input := "line one\nline two\n\x00binary\xff\n"
	got := s.pyOK(t, id, "import sys, hashlib; d = sys.stdin.buffer.read(); print(len(d), hashlib.sha256(d).hexdigest())",
		func(r *roche.ExecRequest) { r.Stdin = strings.NewReader(input) })
	want := fmt.Sprintf("%d %s", len(input), sha256Hex([]byte(input)))
	if got != want {
		t.Fatalf("stdin seen inside: %q, want %q", got, want)
	}
}

// timedWriter records when the first byte arrived.
type timedWriter struct {
	mu    sync.Mutex
	first time.Time
	buf   bytes.Buffer
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first.IsZero() && len(p) > 0 {
		w.first = time.Now()
	}
	return w.buf.Write(p)
}

func (s *suite) testStreaming(t *testing.T, id string) {
	var w timedWriter
	start := time.Now()
	res := s.py(t, id, "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.3)",
		func(r *roche.ExecRequest) { r.Stdout = &w })
	end := time.Now()
	if res.ExitCode != 0 || res.Stdout != "0\n1\n2\n3\n4\n" {
		t.Fatalf("exit %d stdout %q", res.ExitCode, res.Stdout)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.String() != res.Stdout {
		t.Fatalf("streamed %q, captured %q", w.buf.String(), res.Stdout)
	}
	// The program runs for 1.5 s; its first line must reach us at least a second before it ends.
	if w.first.IsZero() || end.Sub(w.first) < time.Second {
		t.Fatalf("first output at %v, program ended at %v: output was not streamed", w.first.Sub(start), end.Sub(start))
	}
}

const writeProbe = `
import errno, sys
try:
    open(sys.argv[1], 'w').write('x')
    print('written')
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
`

func (s *suite) probeWrite(t *testing.T, id, path string) string {
	return s.pyOK(t, id, writeProbe, func(r *roche.ExecRequest) { r.Cmd = append(r.Cmd, path) })
}

func (s *suite) testReadOnlyRoot(t *testing.T, id string) {
	got := s.probeWrite(t, id, "/roche-probe")
	if got == "written" {
		t.Fatal("writing /roche-probe succeeded on a read-only root")
	}
	if s.opts.GVisor && got == "EACCES" {
		// gVisor checks the user's permission before the mount's flags: the root must
		// then be mounted read-only as its kernel tells it.
		opts := s.pyOK(t, id, "print([l.split()[3] for l in open('/proc/self/mounts') if l.split()[1] == '/'][-1])")
		if !slices.Contains(strings.Split(opts, ","), "ro") {
			t.Fatalf("the root is mounted %q inside, want ro", opts)
		}
	} else if s.caps.Processes && got != "EROFS" {
		t.Fatalf("writing /roche-probe failed with %s, want EROFS", got)
	}
	if got := s.probeWrite(t, id, "/tmp/roche-probe"); got != "written" {
		t.Fatalf("writing /tmp/roche-probe: %s, want it written", got)
	}
}

func (s *suite) testWritable(t *testing.T) {
	if !s.caps.Writable {
		t.Skip("provider cannot make the root writable (Capabilities.Writable is false)")
	}
	cfg := s.opts.Config
	cfg.Writable = true
	id := s.create(t, cfg)
	if s.caps.Processes {
		// As the sandbox user, / itself may not be writable by permissions; the mount must be rw.
		got := s.pyOK(t, id, "print([l.split()[3].split(',')[0] for l in open('/proc/self/mounts') if l.split()[1] == '/'][0])")
		if got != "rw" {
			t.Fatalf("root mounted %q with writable=true, want rw", got)
		}
		return
	}
	if got := s.probeWrite(t, id, "/tmp/roche-probe"); got != "written" {
		t.Fatalf("writing /tmp/roche-probe with writable=true: %s", got)
	}
}

func (s *suite) testWorkdir(t *testing.T) {
	cfg := s.opts.Config
	cfg.Workdir = "/tmp"
	id := s.create(t, cfg)
	if got := s.pyOK(t, id, "import os; print(os.getcwd())"); got != "/tmp" {
		t.Fatalf("cwd %q, want /tmp", got)
	}
}

func (s *suite) testTimeout(t *testing.T, id string) {
	start := time.Now()
	res := s.py(t, id, "while True: pass", withTimeout(2*time.Second))
	if !res.TimedOut {
		t.Fatalf("busy loop not reported TimedOut: %+v", res)
	}
	wantEnd(t, "a busy loop past its 2 s timeout", res, roche.EndCommandTimeout)
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("busy loop with a 2 s timeout took %v to stop", el)
	}
	// The sandbox stays usable after a timeout.
	if got := s.pyOK(t, id, "print('alive')"); got != "alive" {
		t.Fatalf("after timeout: %q", got)
	}
}

func (s *suite) testTruncated(t *testing.T, id string) {
	const limit = 1 << 20
	res := s.py(t, id, "import sys; sys.stdout.write('x' * (3 << 20)); sys.stderr.write('e' * 100)",
		func(r *roche.ExecRequest) { r.OutputLimit = limit })
	if !res.Truncated || len(res.Stdout) != limit {
		t.Fatalf("3 MiB of output with a 1 MiB limit: truncated %v, kept %d bytes", res.Truncated, len(res.Stdout))
	}
	if res.Stderr != strings.Repeat("e", 100) {
		t.Fatalf("stderr under the limit was altered: %d bytes", len(res.Stderr))
	}
	if res.ExitCode != 0 {
		t.Fatalf("exit %d: a truncated program should still finish", res.ExitCode)
	}
	wantEnd(t, "3 MiB of output under a 1 MiB cap", res, roche.EndOutputCap)
	// The default limit is 10 MiB.
	res = s.py(t, id, "import sys; sys.stdout.write('y' * (11 << 20))")
	if !res.Truncated || len(res.Stdout) != roche.DefaultOutputLimit {
		t.Fatalf("11 MiB of output, default limit: truncated %v, kept %d bytes", res.Truncated, len(res.Stdout))
	}
}

func (s *suite) testMemoryLimit(t *testing.T) {
	cfg := s.opts.Config
	cfg.Memory = "256m"
	id := s.create(t, cfg)
	if s.opts.GVisor {
		s.endsSandbox(t, id, "b = b'x' * (1 << 30); print(len(b))")
		return
	}
	res := s.py(t, id, "b = b'x' * (1 << 30); print(len(b))", withTimeout(2*time.Minute))
	if res.ExitCode == 0 {
		t.Fatalf("allocating 1 GiB under a 256m limit succeeded: %+v", res)
	}
	if s.caps.Processes && !res.OOMKilled {
		t.Fatalf("allocating 1 GiB: exit %d, OOMKilled false; stderr %q", res.ExitCode, res.Stderr)
	}
	if !res.OOMKilled && !strings.Contains(res.Stderr, "MemoryError") {
		t.Fatalf("allocating 1 GiB was stopped but not reported: exit %d stderr %q", res.ExitCode, res.Stderr)
	}
	if s.caps.Processes {
		wantEnd(t, "allocating 1 GiB under a 256m limit", res, roche.EndOOM)
	}
	// The sandbox survives its program's OOM.
	if got := s.pyOK(t, id, "print('alive')"); got != "alive" {
		t.Fatalf("after OOM: %q", got)
	}
}

// endsSandbox runs a Python program that exceeds the sandbox's memory limit on gVisor,
// where no OOM killer picks a task: the host's kills gVisor's kernel, which ends the
// whole sandbox. The limit holds when the program's exec fails with ErrNotFound and
// the sandbox no longer runs: gone from the list, or listed as exited (a Kubernetes
// Pod that ended stays until it is deleted). Where the error says why it ended
// (roche.EndedError), that is the memory limit.
func (s *suite) endsSandbox(t *testing.T, id, code string) {
	t.Helper()
	res, err := s.p.Exec(ctxFor(t, 3*time.Minute), id, roche.ExecRequest{
		Cmd: append(append([]string{}, s.opts.Python...), "-c", code), Timeout: 2 * time.Minute,
	})
	if !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("exceeding the memory limit on gVisor: %+v %v, want the sandbox ended (ErrNotFound)", res, err)
	}
	t.Logf("exceeding the memory limit on gVisor: %v", err)
	if ended := (*roche.EndedError)(nil); errors.As(err, &ended) && ended.End.Kind != roche.EndOOM {
		t.Errorf("the sandbox past its memory limit ended with %s, want %s", ended.End, roche.EndOOM)
	}
	if err := eventually(func() error {
		list, err := s.p.List(ctxFor(t, time.Minute))
		if err != nil {
			return err
		}
		for _, sb := range list {
			if sb.ID == id && sb.State != roche.StateExited {
				return fmt.Errorf("sandbox %s is still listed, %s, after its memory limit ended it", id, sb.State)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) testNoDockerSocket(t *testing.T, id string) {
	got := s.pyOK(t, id, `
import os
print([p for p in ('/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock') if os.path.exists(p)])`)
	if got != "[]" {
		t.Fatalf("engine sockets visible inside the sandbox: %s", got)
	}
}

func (s *suite) testEmptyCommand(t *testing.T, id string) {
	_, err := s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{})
	if !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("empty command: err %v, want ErrInvalidConfig", err)
	}
}

// noneMadeSince fails the test if a sandbox exists now that was not in before: what
// made it (a refused or failed create) left it behind. Sandboxes gone meanwhile (others'
// ending on a shared engine) do not count.
func (s *suite) noneMadeSince(t *testing.T, before map[string]bool, what string) {
	t.Helper()
	var left []string
	for id := range s.ids(t) {
		if !before[id] {
			left = append(left, id)
		}
	}
	if len(left) > 0 {
		t.Fatalf("%s left sandboxes behind: %v", what, left)
	}
}

func (s *suite) ids(t *testing.T) map[string]bool {
	t.Helper()
	list, err := s.p.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	ids := make(map[string]bool, len(list))
	for _, sb := range list {
		ids[sb.ID] = true
	}
	return ids
}

func (s *suite) testInvalidConfig(t *testing.T) {
	before := s.ids(t)
	cfg := s.opts.Config
	cfg.Memory = "512x"
	cfg.CPUs = 0
	cfg.TimeoutSecs = -1
	_, err := s.p.Create(ctxFor(t, time.Minute), cfg)
	if !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("Create with bad memory, cpus, timeout: err %v, want ErrInvalidConfig", err)
	}
	for _, field := range []string{"memory", "cpus", "timeout_secs"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
	s.noneMadeSince(t, before, "a failed Create")
}

func (s *suite) testUnsupported(t *testing.T) {
	if s.caps.Network {
		t.Skip("provider supports every config this check could ask for")
	}
	cfg := s.opts.Config
	cfg.Network = true
	_, err := s.p.Create(ctxFor(t, time.Minute), cfg)
	if !errors.Is(err, roche.ErrUnsupported) {
		t.Fatalf("network=true on a provider without network: err %v, want ErrUnsupported", err)
	}
}

func (s *suite) testUnknownSandbox(t *testing.T) {
	const id = "roche-no-such-sandbox"
	if _, err := s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("Exec in unknown sandbox: %v, want ErrNotFound", err)
	}
	if _, err := s.p.Inspect(ctxFor(t, time.Minute), id); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("Inspect of unknown sandbox: %v, want ErrNotFound", err)
	}
	if err := s.p.Destroy(ctxFor(t, time.Minute), id); err != nil {
		t.Errorf("Destroy of unknown sandbox: %v, want nil (idempotent)", err)
	}
}

func (s *suite) testListAndDestroy(t *testing.T) {
	cfg := s.opts.Config
	cfg.TimeoutSecs = 120
	opts := kit.CreateOptions{Owner: "providertest:" + strconv.Itoa(os.Getpid())}
	wantOwner := cmp.Or(s.opts.Owner, opts.Owner)
	before := time.Now()
	info, err := kit.Create(ctxFor(t, 2*time.Minute), s.p, cfg, opts)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	s.mu.Lock()
	s.created = append(s.created, info.ID)
	s.mu.Unlock()
	list, err := s.p.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var found *roche.SandboxInfo
	for i := range list {
		if list[i].ID == info.ID {
			found = &list[i]
		}
	}
	if found == nil {
		t.Fatalf("List does not show the new sandbox %s", info.ID)
	}
	if found.State != roche.StateRunning || found.Provider != s.p.Name() {
		t.Errorf("listed %+v, want state running, provider %s", *found, s.p.Name())
	}
	if d := found.ExpiresAt.Sub(before); d < 115*time.Second || d > 125*time.Second+time.Minute {
		t.Errorf("expires %v after create, want about 120 s", d)
	}
	// The owner is what roched and the CLI adopt and collect by: it must survive the
	// provider's own storage (a label, a record on disk), in List and in Inspect.
	if info.Owner != wantOwner || found.Owner != wantOwner {
		t.Errorf("owner from Create %q, from List %q; want %q", info.Owner, found.Owner, wantOwner)
	}
	if got, err := s.p.Inspect(ctxFor(t, time.Minute), info.ID); err != nil || got.Owner != wantOwner {
		t.Errorf("Inspect: owner %q (%v), want %q", got.Owner, err, wantOwner)
	}
	if err := s.p.Destroy(ctxFor(t, time.Minute), info.ID); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := s.p.Destroy(ctxFor(t, time.Minute), info.ID); err != nil {
		t.Fatalf("second Destroy of the same sandbox: %v, want nil (idempotent)", err)
	}
	if s.ids(t)[info.ID] {
		t.Fatalf("sandbox %s still listed after Destroy", info.ID)
	}
	if _, err := s.p.Inspect(ctxFor(t, time.Minute), info.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("Inspect after Destroy: %v, want ErrNotFound", err)
	}
	if _, err := s.p.Exec(ctxFor(t, time.Minute), info.ID, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("Exec after Destroy: %v, want ErrNotFound", err)
	}
}

// testClaim: a sandbox claimed for a holder (as roched claims a pooled one it hands
// out) is listed and inspected with the holder as its owner and the claim's end, keeps
// the claim for whoever reads it later, and cannot be claimed past its own end.
func (s *suite) testClaim(t *testing.T) {
	cl := s.p.(kit.Claimer)
	cfg := s.opts.Config
	cfg.TimeoutSecs = 300
	owner := "providertest-pool:" + strconv.Itoa(os.Getpid())
	id := s.createFor(t, cfg, kit.CreateOptions{Owner: owner})
	ctx := ctxFor(t, time.Minute)
	if _, ok, err := cl.Claimed(ctx, id); ok || err != nil {
		t.Fatalf("Claimed before any claim: %v %v, want none", ok, err)
	}
	if info, err := s.p.Inspect(ctx, id); err == nil && info.Transport != "" && info.Transport != "agent" {
		// Docker's exec API leaves a sandbox nowhere on the host to keep a claim: refused,
		// so that roched makes one for the create instead of handing out an unclaimed one.
		if err := cl.Claim(ctx, id, kit.Claim{Owner: "x", Expires: time.Now().Add(time.Minute)}); !errors.Is(err, roche.ErrUnsupported) {
			t.Errorf("a claim of a sandbox on transport %s: %v, want ErrUnsupported", info.Transport, err)
		}
		return
	}
	if err := cl.Claim(ctx, id, kit.Claim{Owner: "x", Expires: time.Now().Add(time.Hour)}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("a claim past the sandbox's end: %v, want ErrInvalidConfig", err)
	}
	want := kit.Claim{Owner: owner + "/holder", Expires: time.Now().Add(time.Minute).Truncate(time.Second),
		Env: map[string]string{"HELD": "yes"}, Workdir: "/tmp/held"}
	if err := cl.Claim(ctx, id, want); err != nil {
		t.Fatalf("Claim: %v", err)
	}
	got, ok, err := cl.Claimed(ctx, id)
	if err != nil || !ok || got.Owner != want.Owner || !got.Expires.Equal(want.Expires) || got.Env["HELD"] != "yes" || got.Workdir != want.Workdir {
		t.Errorf("Claimed: %+v %v %v, want %+v", got, ok, err, want)
	}
	info, err := s.p.Inspect(ctx, id)
	if err != nil || info.Owner != want.Owner || !info.ExpiresAt.Equal(want.Expires) {
		t.Errorf("Inspect after the claim: owner %q, expires %v (%v); want %q, %v", info.Owner, info.ExpiresAt, err, want.Owner, want.Expires)
	}
	list, err := s.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, sb := range list {
		if sb.ID == id {
			listed = sb.Owner == want.Owner && sb.ExpiresAt.Equal(want.Expires)
			if !listed {
				t.Errorf("List after the claim: owner %q, expires %v; want %q, %v", sb.Owner, sb.ExpiresAt, want.Owner, want.Expires)
			}
		}
	}
	if !listed {
		t.Errorf("List after the claim does not show sandbox %s as claimed", id)
	}
	if s.caps.Processes {
		if res, err := s.p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
			t.Errorf("exec after the claim: %+v %v", res, err)
		}
	}
}

func (s *suite) testCopyFiles(t *testing.T) {
	fc := s.p.(roche.FileCopier)
	cfg := s.opts.Config
	id := s.create(t, cfg)
	dir := t.TempDir()
	payload := make([]byte, 3<<20+17)
	for i := range payload {
		payload[i] = byte(i*7 + i>>9)
	}
	src := filepath.Join(dir, "payload.bin")
	if err := os.WriteFile(src, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 2*time.Minute)
	if err := fc.CopyTo(ctx, id, src, "/tmp/in.bin"); err != nil {
		t.Fatalf("CopyTo: %v", err)
	}
	got := s.pyOK(t, id, "import hashlib; print(hashlib.sha256(open('/tmp/in.bin','rb').read()).hexdigest())")
	if got != sha256Hex(payload) {
		t.Fatalf("sha256 inside %s, want %s", got, sha256Hex(payload))
	}
	s.pyOK(t, id, "open('/tmp/out.txt','w').write('made inside\\n')")
	dst := filepath.Join(dir, "out.txt")
	if err := fc.CopyFrom(ctx, id, "/tmp/out.txt", dst); err != nil {
		t.Fatalf("CopyFrom: %v", err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "made inside\n" {
		t.Fatalf("copied out %q, %v", b, err)
	}
	if err := fc.CopyFrom(ctx, id, "/tmp/no-such-file", filepath.Join(dir, "x")); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("CopyFrom of a missing file: %v, want ErrNotFound", err)
	}
}

func (s *suite) testPause(t *testing.T) {
	pz := s.p.(roche.Pauser)
	id := s.create(t, s.opts.Config)
	ctx := ctxFor(t, time.Minute)
	if err := pz.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	list, err := s.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.ID == id && sb.State != roche.StatePaused {
			t.Fatalf("paused sandbox listed as %s", sb.State)
		}
	}
	if err := pz.Unpause(ctx, id); err != nil {
		t.Fatalf("Unpause: %v", err)
	}
	if got := s.pyOK(t, id, "print('thawed')"); got != "thawed" {
		t.Fatalf("after unpause: %q", got)
	}
}

func (s *suite) testMounts(t *testing.T) {
	ro, rw := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(ro, "in.txt"), []byte("from host"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The sandbox user is not the host user: let it write into the rw mount.
	if err := os.Chmod(rw, 0o777); err != nil {
		t.Fatal(err)
	}
	cfg := s.opts.Config
	cfg.Mounts = []roche.Mount{{Source: ro, Target: "/mnt/ro"}, {Source: rw, Target: "/mnt/rw", ReadWrite: true}}
	id := s.create(t, cfg)
	if got := s.pyOK(t, id, "print(open('/mnt/ro/in.txt').read())"); got != "from host" {
		t.Fatalf("read from ro mount: %q", got)
	}
	if got := s.probeWrite(t, id, "/mnt/ro/new.txt"); got == "written" {
		t.Fatal("wrote into a read-only mount")
	}
	if got := s.probeWrite(t, id, "/mnt/rw/new.txt"); got != "written" {
		t.Fatalf("writing into the rw mount: %s", got)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "new.txt")); err != nil || string(b) != "x" {
		t.Fatalf("file written in the rw mount, seen on host: %q %v", b, err)
	}
}

func (s *suite) testPrivileges(t *testing.T, id string) {
	got := s.pyOK(t, id, `
import ctypes, os
f = dict(l.split(':', 1) for l in open('/proc/self/status'))
nnp = ctypes.CDLL(None).prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
v = open('/proc/version').read()
print(' '.join(k + '=' + f.get(k, 'absent').strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp')),
      'prctl_nnp=%d' % nnp, 'uid=%d' % os.getuid(), 'gid=%d' % os.getgid(), 'gvisor=%s' % ('#1 SMP Sun Jan 10 15:06:54 PST 2016' in v))`)
	fields := map[string]string{}
	for _, kv := range strings.Fields(got) {
		k, v, _ := strings.Cut(kv, "=")
		fields[k] = v
	}
	caps := []string{"CapEff", "CapPrm", "CapBnd", "CapAmb"}
	if s.opts.GVisor {
		// gVisor's /proc/self/status reports its own tasks (older releases without the
		// CapAmb and NoNewPrivs lines): no_new_privs is asked of the kernel itself.
		if fields["gvisor"] != "True" {
			t.Fatalf("the sandbox does not run on gVisor (%s)", got)
		}
		caps = caps[:3]
		if fields["CapAmb"] != "absent" && fields["CapAmb"] != "0000000000000000" {
			t.Errorf("CapAmb = %q, want none", fields["CapAmb"])
		}
		fields["NoNewPrivs"] = fields["prctl_nnp"]
	}
	for _, k := range caps {
		if fields[k] != "0000000000000000" {
			t.Errorf("%s = %q, want every capability dropped", k, fields[k])
		}
	}
	if fields["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs = %q, want 1", fields["NoNewPrivs"])
	}
	// gVisor reports the mode of the filters its own kernel applies (--oci-seccomp).
	if fields["Seccomp"] != "2" {
		t.Errorf("Seccomp = %q, want 2 (filter mode)", fields["Seccomp"])
	}
	if fields["uid"] == "0" || fields["uid"] == "" || fields["gid"] == "0" || fields["gid"] == "" {
		t.Errorf("running as uid %q gid %q, want non-root", fields["uid"], fields["gid"])
	}
	// And the forbidden thing fails: root-only operations are refused.
	res := s.py(t, id, "import os; os.setuid(0)")
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "PermissionError") {
		t.Errorf("setuid(0) inside: exit %d stderr %q, want PermissionError", res.ExitCode, res.Stderr)
	}
}

func (s *suite) testUser(t *testing.T) {
	cfg := s.opts.Config
	cfg.User = "1234:4321"
	id := s.create(t, cfg)
	if got := s.pyOK(t, id, "import os; print(os.getuid(), os.getgid())"); got != "1234 4321" {
		t.Fatalf("uid gid %q, want 1234 4321", got)
	}
}

// interfacesProbe lists the network interfaces: from /sys/class/net, or where a kernel
// has none there (gVisor without a network stack), from the kernel itself.
const interfacesProbe = `
import os, socket
try: names = os.listdir('/sys/class/net')
except FileNotFoundError: names = [n for _, n in socket.if_nameindex()]
print(' '.join(sorted(names)))`

func (s *suite) testNetworkOff(t *testing.T, id string) {
	if got := s.pyOK(t, id, interfacesProbe); got != "lo" {
		t.Fatalf("interfaces with network off: %q, want only lo", got)
	}
	res := s.py(t, id, `
import socket
s = socket.socket(); s.settimeout(3)
try:
    s.connect(('1.1.1.1', 53)); print('connected')
except OSError as e:
    print('refused', e.errno)`)
	if strings.Contains(res.Stdout, "connected") {
		t.Fatal("connected out with network off")
	}
}

func (s *suite) testNetworkOn(t *testing.T) {
	cfg := s.opts.Config
	cfg.Network = true
	id := s.create(t, cfg)
	got := s.pyOK(t, id, interfacesProbe)
	if got == "lo" || !strings.Contains(got, "lo") {
		t.Fatalf("interfaces with network on: %q, want lo and another", got)
	}
}

func (s *suite) testTmpCapped(t *testing.T, id string) {
	got := s.pyOK(t, id, `
import errno, os
n = 0
try:
    with open('/tmp/fill', 'wb') as f:
        while n < (200 << 20):
            f.write(b'\0' * (1 << 20)); f.flush(); n += 1 << 20
    print('unbounded', n)
except OSError as e:
    print(errno.errorcode.get(e.errno), n >> 20)
finally:
    os.remove('/tmp/fill')`)
	fields := strings.Fields(got)
	if len(fields) != 2 || fields[0] != "ENOSPC" {
		t.Fatalf("filling /tmp: %q, want ENOSPC", got)
	}
	if mib, _ := strconv.Atoi(fields[1]); mib < 60 || mib > 64 {
		t.Fatalf("/tmp took %s MiB before ENOSPC, want about 64", fields[1])
	}
}

// markersAlive prints which of the given marker strings still appear in another process's argv.
const markersAlive = `
import os, sys
alive = []
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) != os.getpid():
        try: cmd = open('/proc/%s/cmdline' % p, 'rb').read().decode(errors='replace')
        except OSError: continue
        alive += [m for m in sys.argv[1:] if m in cmd]
print(sorted(set(alive)))`

func (s *suite) testTimeoutKillsTree(t *testing.T) {
	id := s.create(t, s.opts.Config)
	res := s.py(t, id, `
import signal, subprocess, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen(['sh', '-c', 'trap "" TERM; sleep 1000; echo roche-marker-child'])
subprocess.Popen(['python3', '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)  # roche-marker-grandchild'])
print('started', flush=True)
time.sleep(1000)  # roche-marker-parent`, withTimeout(5*time.Second))
	if !res.TimedOut || res.Stdout != "started\n" {
		t.Fatalf("result %+v, want timed out after printing started", res)
	}
	// Give the kernel a moment to finish the kills, then look from inside.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := s.pyOK(t, id, markersAlive, func(r *roche.ExecRequest) {
			r.Cmd = append(r.Cmd, "roche-marker-child", "roche-marker-grandchild", "roche-marker-parent")
		})
		if got == "[]" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes survived the exec timeout: %s", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *suite) testZombiesReaped(t *testing.T, id string) {
	// The child forks a grandchild and exits at once: the grandchild is orphaned to PID 1
	// and, when it exits, only an init that reaps leaves no zombie behind.
	s.pyOK(t, id, `
import os, time
pid = os.fork()
if pid == 0:
    if os.fork() == 0:
        time.sleep(0.3)
        os._exit(0)
    os._exit(0)
os.waitpid(pid, 0)`)
	time.Sleep(time.Second)
	got := s.pyOK(t, id, `
import os
z = []
for p in os.listdir('/proc'):
    if p.isdigit():
        try: st = open('/proc/%s/stat' % p).read()
        except OSError: continue
        if st.rsplit(')', 1)[1].split()[0] == 'Z': z.append(p)
print(z)`)
	if got != "[]" {
		t.Fatalf("zombie processes remain: %s", got)
	}
}

func (s *suite) testPidsLimit(t *testing.T) {
	cfg := s.opts.Config
	cfg.PidsLimit = 20
	id := s.create(t, cfg)
	res := s.py(t, id, `
import os, time
kids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            time.sleep(30); os._exit(0)
        kids.append(pid)
    print('unlimited', len(kids))
except OSError as e:
    print('refused', len(kids))
finally:
    for k in kids: os.kill(k, 9)
    for k in kids: os.waitpid(k, 0)`)
	if res.ExitCode != 0 {
		t.Fatalf("forking 200 children with pids_limit 20: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	got := strings.TrimSpace(res.Stdout)
	// It met the limit and ended well (its children killed and reaped first): nothing
	// ended it, and the receipt says so.
	if res.Receipt != nil && res.Receipt.End != "" {
		t.Errorf("forking past pids_limit 20, then exit 0: the receipt says %q (%s), want nothing",
			res.Receipt.End, res.Receipt.Evidence)
	}
	fields := strings.Fields(got)
	if len(fields) != 2 || fields[0] != "refused" {
		t.Fatalf("forking 200 children with pids_limit 20: %q, want refused", got)
	}
	if n, _ := strconv.Atoi(fields[1]); n < 5 || n >= 20 {
		t.Fatalf("forked %d children under pids_limit 20", n)
	}
	s.testPidsEnd(t, id)
}

// testPidsEnd: a command that fails while its sandbox is at its pids limit gets a
// receipt saying pids, with the count as evidence; one killed at its timeout there says
// command_timeout, the limit in its evidence. The limit that holds is roche-agent's
// RLIMIT_NPROC, whose refusals the kernel counts nowhere, so the agent counts the
// sandbox user's tasks as the command ends (docs/ended.md).
func (s *suite) testPidsEnd(t *testing.T, id string) {
	const fill = `
import os, sys, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60); os._exit(0)
        n += 1
except OSError as e:
    print('refused after', n, e.errno, flush=True)
`
	killAll := func() { // the sleepers it left, so the next command has room
		if _, err := s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{"sh", "-c", "kill -9 -1; true"}}); err != nil {
			t.Fatalf("killing what the command left: %v", err)
		}
	}
	res, err := s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{
		Cmd: append(append([]string{}, s.opts.Python...), "-c", fill+"sys.exit(3)")})
	if err != nil {
		t.Fatalf("filling the pids limit: %v", err)
	}
	killAll()
	if res.Receipt == nil {
		t.Skip("no receipt (no roche-agent): nothing to say why")
	}
	t.Logf("failed at the limit: exit %d, %q, receipt %s (%s)", res.ExitCode, strings.TrimSpace(res.Stdout), res.Receipt.End, res.Receipt.Evidence)
	if res.ExitCode != 3 || !strings.HasPrefix(res.Stdout, "refused after") {
		t.Fatalf("filling the pids limit: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res.Receipt.End != roche.EndPids || !strings.Contains(res.Receipt.Evidence, "RLIMIT_NPROC 20") {
		t.Errorf("a command that failed at pids_limit 20: receipt end %q (%s), want pids with RLIMIT_NPROC 20 as evidence",
			res.Receipt.End, res.Receipt.Evidence)
	}

	res, err = s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{
		Cmd: append(append([]string{}, s.opts.Python...), "-c", fill+"time.sleep(60)"), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("filling the pids limit until the timeout: %v", err)
	}
	killAll()
	t.Logf("timed out at the limit: receipt %s (%s)", res.Receipt.End, res.Receipt.Evidence)
	if !res.TimedOut || res.Receipt.End != roche.EndCommandTimeout || !strings.Contains(res.Receipt.Evidence, "process limit (RLIMIT_NPROC 20)") {
		t.Errorf("a command killed at its timeout at pids_limit 20: timed out %v, receipt end %q (%s), want command_timeout with the limit as evidence",
			res.TimedOut, res.Receipt.End, res.Receipt.Evidence)
	}
}

func (s *suite) testForkBomb(t *testing.T) {
	id := s.create(t, s.opts.Config)
	const bomb = `
import os
while True:
    try: os.fork()
    except OSError: pass`
	began := time.Now()
	res, err := s.p.Exec(ctxFor(t, 3*time.Minute), id, roche.ExecRequest{
		Cmd: append(append([]string{}, s.opts.Python...), "-c", bomb), Timeout: 3 * time.Second})
	t.Logf("the fork bomb's exec (timeout 3 s) returned after %v", time.Since(began).Round(time.Millisecond))
	switch {
	case err == nil && res.TimedOut:
	case err != nil && s.opts.GVisor && errors.Is(err, roche.ErrNotFound):
		// gVisor's tasks live in its sentry, whose host process the sandbox's limits
		// bound: now and then the bomb ends the whole sandbox there (as a cell past the
		// memory limit does) instead of being held at the pids limit. Contained either way.
		if info, ierr := s.p.Inspect(ctxFor(t, time.Minute), id); ierr == nil && info.State == roche.StateRunning {
			t.Fatalf("fork bomb: %v, yet the sandbox is still running", err)
		}
		t.Logf("the fork bomb ended the gVisor sandbox: %v", err)
	case err != nil:
		t.Fatalf("fork bomb: %v", err)
	default:
		t.Fatalf("fork bomb result %+v, want killed at its timeout", res)
	}
	// The host stays responsive while the bomb's sandbox still exists.
	start := time.Now()
	if out, err := exec.Command("sh", "-c", "echo responsive").Output(); err != nil || string(out) != "responsive\n" {
		t.Fatalf("host command after the fork bomb: %q %v", out, err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("host took %v to run echo after the fork bomb", el)
	}
}

// testYes: output past the cap is cut at it, and the command runs on to its timeout. The
// cap is 1 MiB rather than the default 10: a microVM under emulation on a busy host wrote
// 9.3 MB in the 3 s.
func (s *suite) testYes(t *testing.T, id string) {
	const limit = 1 << 20
	res, err := s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{"yes"}, Timeout: 3 * time.Second, OutputLimit: limit})
	if err != nil {
		t.Fatalf("Exec yes: %v", err)
	}
	if !res.Truncated || !res.TimedOut || len(res.Stdout) != limit {
		t.Fatalf("yes: truncated %v timed out %v kept %d bytes, want truncated, timed out, %d bytes", res.Truncated, res.TimedOut, len(res.Stdout), limit)
	}
}

// checkNothingLeaked runs after every check: no sandbox the suite created may remain.
func (s *suite) checkNothingLeaked(t *testing.T) {
	list, err := s.p.List(context.Background())
	if err != nil {
		t.Errorf("List after the suite: %v", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	mine := map[string]bool{}
	for _, id := range s.created {
		mine[id] = true
	}
	for _, sb := range list {
		if mine[sb.ID] {
			t.Errorf("sandbox %s survived the suite", sb.ID)
		}
	}
}

// syscallProbe calls the system calls named in argv through libc and prints, for each,
// "name=allowed" or "name=ERRNO". ptrace is tried the way an attacker would use it:
// attaching to a child of its own, which the kernel allows a process without privileges.
const syscallProbe = `
import ctypes, errno, os, platform, sys, time
numbers = {
    'x86_64': {'io_uring_setup': 425, 'ptrace': 101},
    'aarch64': {'io_uring_setup': 425, 'ptrace': 117},
}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(numbers[name], *args)
    return 'allowed' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
out = []
for name in sys.argv[1:]:
    if name == 'io_uring_setup':
        params = ctypes.create_string_buffer(120)
        out.append(name + '=' + call(name, 1, params))
    elif name == 'ptrace':
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        out.append(name + '=' + call(name, 16, pid, 0, 0))  # PTRACE_ATTACH
        os.kill(pid, 9)
        os.waitpid(pid, 0)
print(' '.join(out))`

// testKernelAttackSurface: the system calls Roche refuses everywhere (see
// docs/security.md) fail from inside, with EPERM from a seccomp filter or ENOSYS from a
// kernel without them, while the program making them runs on.
func (s *suite) testKernelAttackSurface(t *testing.T, id string) {
	got := s.pyOK(t, id, syscallProbe, func(r *roche.ExecRequest) { r.Cmd = append(r.Cmd, "io_uring_setup", "ptrace") })
	for _, kv := range strings.Fields(got) {
		name, result, _ := strings.Cut(kv, "=")
		if result != "EPERM" && result != "ENOSYS" {
			t.Errorf("%s inside the sandbox: %s, want EPERM or ENOSYS", name, result)
		}
	}
	if n := len(strings.Fields(got)); n != 2 {
		t.Fatalf("probe printed %q, want two results", got)
	}
}

// testHome: HOME is a directory the sandbox user can write, not root's or a missing one.
func (s *suite) testHome(t *testing.T, id string) {
	got := s.pyOK(t, id, `
import os
home = os.environ.get('HOME', '')
p = os.path.join(home, '.roche-home-probe')
open(p, 'w').write('x')
os.remove(p)
print(home)`)
	if got == "" || got == "/root" {
		t.Fatalf("HOME is %q, want a directory the sandbox user can write", got)
	}
}

// inotifyHog takes inotify instances until the kernel refuses one, bounded, reports how
// many it holds and why it stopped, and holds them until it is killed.
const inotifyHog = `
import ctypes, errno, resource, time
libc = ctypes.CDLL(None, use_errno=True)
fds, why = [], 'bound'
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        why = errno.errorcode.get(ctypes.get_errno(), '?')
        break
    fds.append(fd)
print('held', len(fds), why, resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)
time.sleep(600)`

const inotifyOne = `
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print('ok' if fd >= 0 else errno.errorcode.get(ctypes.get_errno(), '?'))`

// LineWriter hands over the first complete line written to it on the channel Line
// returns: a program's readiness line, for tests that wait on it while it runs on.
type LineWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	line chan string // nil once the line is sent
	out  chan string
}

// NewLineWriter returns a LineWriter waiting for its first line.
func NewLineWriter() *LineWriter {
	c := make(chan string, 1)
	return &LineWriter{line: c, out: c}
}

// Line delivers the first complete line, once.
func (w *LineWriter) Line() <-chan string { return w.out }

func (w *LineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if line, _, ok := strings.Cut(w.buf.String(), "\n"); ok && w.line != nil {
		w.line <- line
		w.line = nil
	}
	return len(p), nil
}

// testPerUserLimits does the attack of one sandbox on another through a per-user kernel
// limit: sandbox A takes every inotify instance its user may have (fs.inotify.
// max_user_instances, counted per uid), and holds them; sandbox B, made with the same
// config, must still get one. Sandboxes sharing a uid fail this.
func (s *suite) testPerUserLimits(t *testing.T) {
	a := s.create(t, s.opts.Config)
	b := s.create(t, s.opts.Config)
	ctx, cancel := context.WithCancel(context.Background())
	w := NewLineWriter()
	done := make(chan error, 1)
	go func() {
		_, err := s.p.Exec(ctx, a, roche.ExecRequest{
			Cmd: append(append([]string{}, s.opts.Python...), "-c", inotifyHog), Timeout: 5 * time.Minute, Stdout: w,
		})
		done <- err
	}()
	defer func() {
		cancel()
		<-done
	}()
	var held string
	select {
	case held = <-w.Line():
	case err := <-done:
		t.Fatalf("the inotify hog in sandbox A ended before holding its instances: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the inotify hog in sandbox A printed nothing within 2 minutes")
	}
	f := strings.Fields(held)
	if len(f) != 4 || f[2] != "EMFILE" {
		t.Fatalf("sandbox A: %q, want it to run out of inotify instances (EMFILE): the attack could not be mounted", held)
	}
	n, _ := strconv.Atoi(f[1])
	// gVisor's kernel, one per sandbox, has no per-user inotify limit: the hog there
	// runs out of its own descriptors, and B must still get its instance.
	if nofile, err := strconv.Atoi(f[3]); !s.opts.GVisor && (err != nil || nofile >= 0 && n+8 >= nofile) {
		t.Fatalf("sandbox A: %q: it ran out of file descriptors (RLIMIT_NOFILE %s), not of inotify instances", held, f[3])
	}
	if got := s.pyOK(t, b, inotifyOne); got != "ok" {
		t.Fatalf("sandbox B's inotify_init1 while sandbox A holds %s instances: %s, want ok (the sandboxes share a per-user limit)", f[1], got)
	}
}

// tmpfsFill fills /tmp, then /dev/shm, a MiB at a time up to 200 MiB each, and reports
// how each ended (ENOSPC at the tmpfs' size cap, or "full" at 200 MiB) and the MiB
// written, one line each ("tmp ENOSPC 64"). Memory in a tmpfs counts against the
// sandbox's memory limit and belongs to no process.
const tmpfsFill = `
import errno, sys
def fill(path):
    n = 0
    try:
        with open(path, 'wb') as f:
            while n < 200:
                f.write(b'\1' * (1 << 20)); f.flush(); n += 1
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno)), n
    return 'full', n
print('tmp', *fill('/tmp/roche-fill'), flush=True)
print('shm', *fill('/dev/shm/roche-fill'), flush=True)`

// filled is tmpfsFill's output when both mounts, of mib MiB, were filled to their size
// and refused more with ENOSPC.
func filled(mib int64) string { return fmt.Sprintf("tmp ENOSPC %d\nshm ENOSPC %d\n", mib, mib) }

// tmpfsSizes prints the sizes of /tmp and /dev/shm in MiB.
const tmpfsSizes = `
import os
print(*(os.statvfs(p).f_blocks * os.statvfs(p).f_frsize >> 20 for p in ('/tmp', '/dev/shm')))`

// grabMemory takes 256 MiB, more than any limit the tests below set leaves.
const grabMemory = "b = b'x' * (256 << 20); print(len(b))"

// testOOMThroughTmpfs: the tmpfs mounts, /tmp and /dev/shm, live in the sandbox's memory,
// and what they hold belongs to no process, so the OOM killer cannot win it back by
// killing one: were the mounts able to fill the limit, the agent would be killed next,
// and the sandbox with it. Under a small limit they are sized (Config.TmpSize) so that
// filling both gets ENOSPC, not an OOM kill, and a small command still runs; a program
// that then takes memory is the one killed, reported OOMKilled, also when a shell ran it
// (which then exits 137); a SIGKILL for another reason is not an OOM kill. The sandbox
// survives it all.
func (s *suite) testOOMThroughTmpfs(t *testing.T) {
	cfg := s.opts.Config
	cfg.Memory = "128m" // a VM's least: the mounts are 48 MiB each under it
	id := s.create(t, cfg)
	files := []string{"/tmp/roche-fill", "/dev/shm/roche-fill"}
	clean := func() {
		t.Helper()
		if fsys, ok := s.p.(roche.FileSystem); ok {
			var errs []error
			for _, f := range files {
				if err := fsys.Remove(ctxFor(t, time.Minute), id, f); !errors.Is(err, roche.ErrNotFound) {
					errs = append(errs, err)
				}
			}
			err := errors.Join(errs...)
			if err == nil {
				return
			}
			if !errors.Is(err, roche.ErrUnsupported) {
				t.Fatalf("removing the fill files: %v", err)
			}
		}
		res, err := s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: append([]string{"rm", "-f"}, files...), Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("removing the fill files: %+v %v", res, err)
		}
	}
	mib := cfg.TmpSize() >> 20
	// The sizes the mounts were made with, also where a fill cannot reach them (a VM).
	if got, want := s.pyOK(t, id, tmpfsSizes), fmt.Sprintf("%d %d", mib, mib); got != want {
		t.Fatalf("the sizes of /tmp and /dev/shm under memory=128m: %q MiB, want %q", got, want)
	}
	switch res := s.py(t, id, tmpfsFill, withTimeout(2*time.Minute)); {
	case s.opts.VM && res.OOMKilled && res.ExitCode == 137:
		// The guest's kernel took its share of the 128 MiB first.
		t.Logf("the guest OOM-killed the fill before the mounts were full (stdout %q)", res.Stdout)
		clean()
	case res.ExitCode != 0 || res.OOMKilled || res.Stdout != filled(mib):
		t.Fatalf("filling the tmpfs mounts under memory=128m: exit %d OOMKilled %v stdout %q stderr %q, want both refused with ENOSPC at %d MiB",
			res.ExitCode, res.OOMKilled, res.Stdout, res.Stderr, mib)
	}
	if got := s.pyOK(t, id, "print('alive')"); got != "alive" {
		t.Fatalf("with both tmpfs mounts full: %q, want a small command to run", got)
	}
	if s.opts.GVisor {
		// gVisor's kernel holds the mounts and the program alike: a program over the
		// limit ends the sandbox.
		s.endsSandbox(t, id, grabMemory)
		s.tmpfsFillRoomy(t)
		return
	}
	py := append([]string{}, s.opts.Python...)
	for _, c := range []struct {
		name string
		cmd  []string
	}{
		{"directly", append(append([]string{}, py...), "-c", grabMemory)},
		// "; exit $?" keeps the shell from replacing itself with the program.
		{"under a shell", append([]string{"sh", "-c", `"$@"; exit $?`, "sh"}, append(append([]string{}, py...), "-c", grabMemory)...)},
	} {
		res, err := s.p.Exec(ctxFor(t, 3*time.Minute), id, roche.ExecRequest{Cmd: c.cmd, Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatalf("taking 256 MiB %s with the tmpfs mounts full: %v", c.name, err)
		}
		if !res.OOMKilled || res.ExitCode != 137 || res.TimedOut || res.Stdout != "" {
			t.Errorf("taking 256 MiB %s with the tmpfs mounts full under memory=128m: exit %d OOMKilled %v timed out %v, stdout %q; want exit 137 and OOMKilled",
				c.name, res.ExitCode, res.OOMKilled, res.TimedOut, res.Stdout)
		}
		if got := s.pyOK(t, id, "print('alive')"); got != "alive" {
			t.Fatalf("after the OOM kill %s: %q", c.name, got)
		}
	}
	clean()

	// A SIGKILL that is not the OOM killer's is not an OOM kill.
	res, err := s.p.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{"sh", "-c", "kill -9 $$"}, Timeout: time.Minute})
	if err != nil || res.ExitCode != 137 || res.OOMKilled {
		t.Errorf("sh killing itself with SIGKILL: %+v %v, want exit 137, not OOMKilled", res, err)
	}

	s.tmpfsFillRoomy(t)

	if got := s.pyOK(t, id, "print('alive')"); got != "alive" {
		t.Fatalf("after the OOM kills: %q", got)
	}
}

// tmpfsFillRoomy: with the suite's memory limit both tmpfs mounts fill to their caps:
// ENOSPC, not OOM.
func (s *suite) tmpfsFillRoomy(t *testing.T) {
	roomy := s.create(t, s.opts.Config)
	res := s.py(t, roomy, tmpfsFill, withTimeout(2*time.Minute))
	if mib := s.opts.Config.TmpSize() >> 20; res.ExitCode != 0 || res.OOMKilled || res.Stdout != filled(mib) {
		t.Errorf("filling the tmpfs mounts under memory=%s: exit %d OOMKilled %v stdout %q stderr %q, want both full (ENOSPC at %d MiB), exit 0, not OOMKilled",
			s.opts.Config.Memory, res.ExitCode, res.OOMKilled, res.Stdout, res.Stderr, mib)
	}
}

// wantEnd checks that a command's receipt says why it ended (roche.Receipt.End), with
// the evidence it was read from. A result without a receipt (no roche-agent measured the
// command: wasm, a fallback transport) has nothing to say, which is checked elsewhere.
func wantEnd(t *testing.T, what string, res roche.ExecResult, want roche.EndKind) {
	t.Helper()
	if res.Receipt == nil {
		return
	}
	if res.Receipt.End != want || res.Receipt.Evidence == "" {
		t.Errorf("%s: the receipt says the command ended %q (evidence %q), want %q with evidence",
			what, res.Receipt.End, res.Receipt.Evidence, want)
		return
	}
	t.Logf("%s: ended %s (%s)", what, res.Receipt.End, res.Receipt.Evidence)
}
