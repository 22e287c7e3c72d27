package oci_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/oci"
	"github.com/roche-sandbox/roche/provider/providertest"
)

func TestMain(m *testing.M) {
	// Every exec, copy and attach must have let go of its goroutines.
	os.Exit(testenv.RunWithAgent(m))
}

// newProvider opens a provider with a state directory of the test's own, so that what it
// leaves (or not) is its alone.
func newProvider(t *testing.T, opts ...oci.Option) (*oci.Provider, string) {
	t.Helper()
	testenv.Needs(t, testenv.Root, testenv.Docker) // images come from Docker's store
	state := filepath.Join("/run/roche-test", "oci-"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))
	data := filepath.Join("/var/lib/roche-test/oci")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	opts = append([]oci.Option{oci.WithStateDir(state), oci.WithDataDir(data)}, opts...)
	// Cgroups that were there before are not this test's to account for (another
	// process's sandboxes, on the same host).
	before, _ := filepath.Glob("/sys/fs/cgroup/*/roche-*")
	p, err := oci.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		checkNothingLeft(t, p, state, before)
		// The tmpfs the provider puts its state on where /run is not one (stateOnTmpfs)
		// is the test's own too. The image cache under the data directory stays, for
		// the next run.
		if err := unix.Unmount(state, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("unmounting the state directory's tmpfs: %v", err)
		}
		os.RemoveAll(state)
	})
	return p, state
}

// checkNothingLeft: no container in the runtime's state, no mount below the state or
// disk directories, no cgroup but those there before or in use, and no sandbox directory.
func checkNothingLeft(t *testing.T, p *oci.Provider, state string, before []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, err := p.Runtime(ctx)
	if err != nil {
		return // no runtime ran anything
	}
	out, err := exec.Command(name, "--root", filepath.Join(state, "runtime", name), "list", "--quiet").CombinedOutput()
	if err != nil {
		t.Errorf("%s list: %v: %s", name, err, out)
	} else if s := strings.TrimSpace(string(out)); s != "" {
		t.Errorf("containers left in %s's state: %s", name, s)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, state+"/") || strings.Contains(line, "/var/lib/roche-test/oci/sandboxes/") {
			t.Errorf("mount left: %s", line)
		}
	}
	entries, _ := os.ReadDir(state)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), oci.Name+"-") {
			t.Errorf("sandbox directory left: %s", e.Name())
		}
	}
	// Nor those of sandboxes that live on (another process's: this test's own are gone
	// from the runtime's state, checked above).
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/roche-*")
	if cg = slices.DeleteFunc(cg, func(c string) bool {
		tasks, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", filepath.Base(c), "tasks"))
		return slices.Contains(before, c) || len(tasks) > 0
	}); len(cg) > 0 {
		t.Errorf("cgroups left: %v", cg)
	}
	if d, _ := os.ReadDir("/var/lib/roche-test/oci/sandboxes"); len(d) > 0 {
		t.Errorf("sandbox disks left: %d", len(d))
	}
}

func testConfig() roche.Config {
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	return cfg
}

func TestHello(t *testing.T) {
	p, state := newProvider(t)
	ctx := context.Background()
	start := time.Now()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("created %s in %v", info.ID, time.Since(start))
	defer p.Destroy(ctx, info.ID)
	// Its state is on a tmpfs (the provider's own where /run is not one, as here).
	var fs unix.Statfs_t
	if err := unix.Statfs(state, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Errorf("the state directory %s is not on a tmpfs (type %#x, %v)", state, fs.Type, err)
	}
	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('hello')"}})
	if err != nil || res.Stdout != "hello\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
}

// TestConcurrentDestroys: destroys that overlap share runs of crun (delete --regex), and
// every one of them is done when it returns: its sandbox is gone and its processes with
// it (the cleanup checks no container, mount, cgroup or directory is left).
func TestConcurrentDestroys(t *testing.T) {
	var logs batchLog
	p, _ := newProvider(t, oci.WithLogger(slog.New(&logs)))
	ctx := context.Background()
	name, err := p.Runtime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	ids := make([]string, n)
	for i := range ids {
		info, err := p.Create(ctx, testConfig())
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = info.ID
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Destroy(ctx, id)
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if errs[i] != nil {
			t.Errorf("destroy %s: %v", id, errs[i])
		}
		if _, err := p.Inspect(ctx, id); !errors.Is(err, roche.ErrNotFound) {
			t.Errorf("inspect %s after its destroy: %v, want ErrNotFound", id, err)
		}
	}
	if name == oci.RuntimeCrun && logs.max.Load() < 2 {
		t.Errorf("%d overlapping destroys ran crun once each (largest batch %d)", n, logs.max.Load())
	}
	t.Logf("largest batch of deletes in one run of %s: %d", name, logs.max.Load())
}

// batchLog is a slog handler that keeps the largest batch of deletes logged.
type batchLog struct{ max atomic.Int64 }

func (*batchLog) Enabled(context.Context, slog.Level) bool { return true }
func (b *batchLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "deleted containers in one run" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "n" && a.Value.Int64() > b.max.Load() {
				b.max.Store(a.Value.Int64())
			}
			return true
		})
	}
	return nil
}
func (b *batchLog) WithAttrs([]slog.Attr) slog.Handler { return b }
func (b *batchLog) WithGroup(string) slog.Handler      { return b }

// TestConformance runs the suite on the default runtime (crun here), egress relay on as
// roched has it.
func TestConformance(t *testing.T) {
	p, state := newProvider(t, oci.WithEgressProxy())
	providertest.Run(t, p, providertest.Options{Config: testConfig(), PidsExact: true, HostPIDs: runtimePIDs(p, state)})
}

// TestConformanceRunc runs the suite on runc, the runtime where crun is missing or
// refuses the host.
func TestConformanceRunc(t *testing.T) {
	p, state := newProvider(t, oci.WithEgressProxy(), oci.WithRuntime(oci.RuntimeRunc))
	providertest.Run(t, p, providertest.Options{Config: testConfig(), PidsExact: true, HostPIDs: runtimePIDs(p, state)})
}

// TestRuntimeProbe: each runtime asked for either makes a sandbox that runs python, or is
// refused with one line saying why.
func TestRuntimeProbe(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	for _, name := range oci.Runtimes() {
		t.Run(name, func(t *testing.T) {
			p, _ := newProvider(t, oci.WithRuntime(name))
			ctx := context.Background()
			info, err := p.Create(ctx, testConfig())
			if err != nil {
				if !errors.Is(err, roche.ErrUnavailable) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("refusal %q, want one line of ErrUnavailable", err)
				}
				t.Logf("%s refused: %v", name, err)
				return
			}
			defer p.Destroy(ctx, info.ID)
			res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('hello')"}})
			if err != nil || res.Stdout != "hello\n" {
				t.Fatalf("exec: %+v %v", res, err)
			}
			t.Logf("%s works", name)
		})
	}
}

// TestCrunHybridNamespace: on a hybrid cgroup host crun runs in a mount namespace without
// the cgroup2 mount (see startWithoutUnified). That namespace must stay crun's: after
// many creates this process still sees the cgroup2 mount and every sandbox's root (a
// namespace left on the process's first thread would hide both from /proc/self), and
// each sandbox's memory limit is set in the v1 memory controller.
func TestCrunHybridNamespace(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err != nil {
		t.Skip("not a hybrid cgroup host")
	}
	p, state := newProvider(t, oci.WithRuntime(oci.RuntimeCrun))
	ctx := context.Background()
	cfg := testConfig()
	var wg sync.WaitGroup
	ids := make([]string, 8)
	errs := make([]error, len(ids))
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info, err := p.Create(ctx, cfg)
			ids[i], errs[i] = info.ID, err
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		defer p.Destroy(ctx, id)
	}
	for _, f := range []string{"/proc/self/mountinfo", "/proc/thread-self/mountinfo"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), " /sys/fs/cgroup/unified ") {
			t.Errorf("%s lacks the cgroup2 mount: a namespace made for crun leaked into this process", f)
		}
		for _, id := range ids {
			if !strings.Contains(string(b), filepath.Join(state, id, "rootfs")) {
				t.Errorf("%s lacks sandbox %s's root", f, id)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/roche-"+ids[0], "memory.limit_in_bytes"))
	if err != nil {
		t.Fatalf("the sandbox's v1 memory cgroup: %v", err)
	}
	if got, want := strings.TrimSpace(string(b)), strconv.FormatInt(cfg.MemoryBytes(), 10); got != want {
		t.Errorf("memory.limit_in_bytes %s, want %s", got, want)
	}
}

// TestRunscRefused: gVisor as a bare runtime is refused in one line, before anything runs.
func TestRunscRefused(t *testing.T) {
	_, err := oci.New(oci.WithRuntime(oci.RuntimeRunsc))
	if !errors.Is(err, roche.ErrUnsupported) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("runsc: %v, want one line of ErrUnsupported", err)
	}
}

// TestRestartFindsSandboxes: a new process (a new Provider on the same directories) finds
// a live sandbox from what is on disk and reaches its agent; once the sandbox's lifetime
// ended, that process tears it down at once, mounts, disk and all (it watches the PID 1
// of each sandbox it finds); a create that died half-way (a record, nothing running, past
// its start-by) is cleared by GC.
func TestRestartFindsSandboxes(t *testing.T) {
	first, state := newProvider(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.TimeoutSecs = 4
	cfg.Writable = true // a sized disk to clear as well
	info, err := first.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	first.Close()

	again, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	list, err := again.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != info.ID || list[0].State != roche.StateRunning {
		t.Fatalf("list after restart: %+v %v, want %s running", list, err, info.ID)
	}
	res, err := again.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"echo", "found"}})
	if err != nil || res.Stdout != "found\n" {
		t.Fatalf("exec after restart: %+v %v", res, err)
	}

	// Creates that died before writing their record (waiting for the state directory's
	// lock): one past the time it gives up, cleared by GC; one still within it, kept.
	for id, by := range map[string]time.Time{"oci-00000000deadbee0": time.Now().Add(-time.Second), "oci-00000000deadbee1": time.Now().Add(time.Minute)} {
		if err := os.Mkdir(filepath.Join(state, id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(state, id, "start_by"), []byte(strconv.FormatInt(by.Unix(), 10)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	defer os.RemoveAll(filepath.Join(state, "oci-00000000deadbee1"))
	// Creates killed while their directory still had its hidden name: one made two
	// minutes ago, cleared; one just made, kept.
	for id, made := range map[string]time.Time{".oci-00000000deadbee2": time.Now().Add(-2 * time.Minute), ".oci-00000000deadbee3": time.Now()} {
		if err := os.Mkdir(filepath.Join(state, id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(state, id), made, made); err != nil {
			t.Fatal(err)
		}
	}
	defer os.RemoveAll(filepath.Join(state, ".oci-00000000deadbee3"))

	// A create that died after writing its record.
	dead := filepath.Join(state, "oci-00000000deadbeef")
	if err := os.Mkdir(dead, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := `{"id":"oci-00000000deadbeef","runtime":"runc","created":"2020-01-01T00:00:00Z","expires":"2020-01-01T00:01:00Z","start_by":"2020-01-01T00:00:30Z","uid":-1}`
	if err := os.WriteFile(filepath.Join(dead, "record.json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, 30*time.Second, "the sandbox to be torn down at the end of its lifetime", func() bool {
		_, err := again.Inspect(ctx, info.ID)
		return errors.Is(err, roche.ErrNotFound)
	})
	removed, err := again.GC(ctx, roche.GCOptions{})
	if err != nil || len(removed) != 1 || removed[0].ID != "oci-00000000deadbeef" {
		t.Fatalf("GC removed %+v (%v), want the dead create", removed, err)
	}
	if _, err := os.Stat(filepath.Join(state, "oci-00000000deadbee0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the directory of a create that died before its record, past its start-by, is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "oci-00000000deadbee1")); err != nil {
		t.Errorf("the directory of a create still within its start-by was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, ".oci-00000000deadbee2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the hidden directory of a create killed two minutes ago is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, ".oci-00000000deadbee3")); err != nil {
		t.Errorf("the hidden directory of a create just begun was removed: %v", err)
	}
	if list, _ := again.List(ctx); len(list) != 0 {
		t.Fatalf("list after GC: %+v", list)
	}
}

// compatSyscall makes getpid through the 32-bit entry point (int 0x80, eax 20) from
// code it maps executable, and prints the pid it got: a sandbox whose filter covers the
// native architecture only never gets there (the filter kills it with SIGSYS).
const compatSyscall = `
import ctypes, mmap, os
code = bytes([0x53, 0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0x5b, 0xc3])  # push rbx; mov eax,20; int 0x80; pop rbx; ret
buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
print('got pid', ctypes.CFUNCTYPE(ctypes.c_int)(addr)(), flush=True)`

// TestCompatSyscallsRefused: the seccomp filter covers the native architecture only.
func TestCompatSyscallsRefused(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe is x86 machine code")
	}
	p, _ := newProvider(t)
	ctx := context.Background()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", compatSyscall}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Stdout, "got pid") || res.ExitCode == 0 {
		t.Fatalf("a 32-bit system call went through: %+v", res)
	}
	t.Logf("32-bit getpid: exit %d, stderr %q", res.ExitCode, res.Stderr)
}

// forbiddenSyscalls makes system calls Roche's seccomp profile refuses, and which a root
// sandbox process without the filter may make (an unprivileged user namespace; an
// unknown personality), plus getpid, which it allows, and prints each one's errno.
const forbiddenSyscalls = `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
out = []
for name, nr, args in (('unshare_user', 272, (0x10000000,)), ('personality', 135, (0xffffffff,)),
                       ('add_key', 248, ()), ('keyctl', 250, ()), ('bpf', 321, ()), ('getpid', 39, ())):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    out.append('%s=%d' % (name, ctypes.get_errno() if r < 0 else 0))
print(' '.join(out))`

// TestCompiledSeccomp: crun compiles the seccomp filter for the provider's first sandbox;
// later ones are handed that compilation (crun's run.oci.seccomp_bpf_data, which
// replaces config.json's filter), and the filter holds in them as in the first: the
// calls it refuses fail with EPERM, as root in the sandbox, where they would succeed
// without it. A compiled filter crun refuses is dropped.
func TestCompiledSeccomp(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe's system call numbers are amd64's")
	}
	p, state := newProvider(t)
	ctx := context.Background()
	name, err := p.Runtime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.User = "root"
	var ids []string
	for range 2 {
		info, err := p.Create(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Destroy(ctx, info.ID)
		ids = append(ids, info.ID)
	}
	annotation := func(id string) string {
		b, err := os.ReadFile(filepath.Join(state, id, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var spec struct {
			Annotations map[string]string `json:"annotations"`
			Linux       struct {
				Seccomp *struct{} `json:"seccomp"`
			} `json:"linux"`
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatal(err)
		}
		if spec.Linux.Seccomp == nil {
			t.Errorf("%s: config.json has no seccomp filter (a runtime that ignores the annotation would run without one)", id)
		}
		return spec.Annotations["run.oci.seccomp_bpf_data"]
	}
	if got := annotation(ids[0]); got != "" {
		t.Errorf("the first sandbox was handed a compiled filter before any was compiled")
	}
	got := annotation(ids[1])
	if name != oci.RuntimeCrun {
		if got != "" {
			t.Errorf("%s was handed crun's compiled filter", name)
		}
	} else {
		compiled, err := os.ReadFile(filepath.Join(state, "runtime", name, ids[0], "seccomp.bpf"))
		if err != nil {
			t.Fatal(err)
		}
		if want := base64.StdEncoding.EncodeToString(compiled); got != want {
			t.Errorf("the second sandbox was handed %d bytes of base64, want crun's compilation for the first (%d)", len(got), len(want))
		}
	}
	if name == oci.RuntimeCrun {
		// A compiled filter crun refuses (a jump past the program's end, which the kernel
		// rejects) fails that one create, and is not handed to the next, which compiles
		// its own again.
		p.SetCompiledSeccomp(base64.StdEncoding.EncodeToString([]byte{0x05, 0, 0, 0, 100, 0, 0, 0}))
		if info, err := p.Create(ctx, cfg); err == nil {
			p.Destroy(ctx, info.ID)
			t.Fatalf("a sandbox handed a malformed filter was created (%s)", info.ID)
		} else if !errors.Is(err, roche.ErrUnavailable) {
			t.Errorf("create with a malformed filter: %v, want ErrUnavailable", err)
		}
		info, err := p.Create(ctx, cfg)
		if err != nil {
			t.Fatalf("the create after a refused filter: %v", err)
		}
		defer p.Destroy(ctx, info.ID)
		if got := annotation(info.ID); got != "" {
			t.Errorf("the create after a refused filter was handed %d bytes of base64, want none (crun compiles it)", len(got))
		}
		ids = append(ids, info.ID)
	}
	want := "unshare_user=1 personality=1 add_key=1 keyctl=1 bpf=1 getpid=0"
	for _, id := range ids {
		res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"python3", "-c", forbiddenSyscalls}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
		if strings.TrimSpace(res.Stdout) != want {
			t.Errorf("%s: %s, want %s", id, strings.TrimSpace(res.Stdout), want)
		}
	}
}

// TestProbe: a live sandbox answers the pool's probe; a destroyed one does not.
func TestProbe(t *testing.T) {
	p, _ := newProvider(t)
	ctx := context.Background()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Probe(ctx, info.ID); err != nil {
		t.Fatalf("probe of a live sandbox: %v", err)
	}
	if err := p.Destroy(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Probe(ctx, info.ID); err == nil {
		t.Fatal("probe of a destroyed sandbox succeeded")
	}
}

// TestWorkdirMissingFromImage: a workdir the image lacks is made, on a read-only root too.
func TestWorkdirMissingFromImage(t *testing.T) {
	p, _ := newProvider(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.Workdir = "/srv/roche-work"
	info, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"pwd"}})
	if err != nil || res.Stdout != "/srv/roche-work\n" {
		t.Fatalf("pwd: %+v %v", res, err)
	}
}

// TestOCILayout: an image from an OCI image layout, here a one-layer image made on the
// spot (no shell, no python: the agent is all it needs), is unpacked, its whiteouts
// applied, and served.
func TestOCILayout(t *testing.T) {
	p, _ := newProvider(t)
	ctx := context.Background()
	layer := func(files map[string]string) v1.Layer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for name, body := range files {
			tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
			tw.Write([]byte(body))
		}
		tw.Close()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	stamp := time.Now().String() // a config digest of this run's own: unpacked here, not found in the cache
	img, err := mutate.AppendLayers(empty.Image,
		layer(map[string]string{"hello.txt": "from a layout\n", "gone.txt": "x"}),
		layer(map[string]string{".wh.gone.txt": ""}))
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, v1.Config{Env: []string{"STAMP=" + stamp}}); err != nil {
		t.Fatal(err)
	}
	name, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	// This image's cache entry is of no use to another run.
	t.Cleanup(func() { os.RemoveAll(filepath.Join("/var/lib/roche-test/oci/images", name.Hex)) })
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Image = oci.LayoutPrefix + dir
	info, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	var got bytes.Buffer
	if err := p.ReadFile(ctx, info.ID, "/hello.txt", &got); err != nil || got.String() != "from a layout\n" {
		t.Fatalf("/hello.txt: %q %v", got.String(), err)
	}
	if _, err := p.Stat(ctx, info.ID, "/gone.txt"); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("/gone.txt, whited out: %v, want ErrNotFound", err)
	}
	if name, err := os.ReadDir(filepath.Join("/var/lib/roche-test/oci/images")); err != nil || len(name) == 0 {
		t.Fatalf("image cache: %v", err)
	}
	bad := testConfig()
	bad.Image = oci.LayoutPrefix + t.TempDir()
	if _, err := p.Create(ctx, bad); !errors.Is(err, roche.ErrImageNotFound) {
		t.Fatalf("an empty directory as a layout: %v, want ErrImageNotFound", err)
	}
}

// TestGCPrunesUnusedImages: an unpacked image no sandbox uses and no create used for an
// hour goes at GC; the one just used stays.
func TestGCPrunesUnusedImages(t *testing.T) {
	p, _ := newProvider(t)
	ctx := context.Background()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	p.Destroy(ctx, info.ID)
	images := "/var/lib/roche-test/oci/images"
	stale := filepath.Join(images, "00000000000000000000000000000000000000000000000000000000000000aa")
	if err := os.MkdirAll(filepath.Join(stale, "rootfs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "image.json"), []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(stale, "image.json"), old, old)
	before, _ := os.ReadDir(images)
	if _, err := p.GC(ctx, roche.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stale image is still cached: %v", err)
	}
	after, _ := os.ReadDir(images)
	if len(after) < 2 { // refs and the image just used
		t.Fatalf("GC removed the image just used: before %d entries, after %d", len(before), len(after))
	}
}

// TestLeased: a leased sandbox's lease is taken at create, dropped at Close (the
// sandbox then stops within the grace and is torn down), and Keep ends it for one that should outlive its
// creator.
func TestLeased(t *testing.T) {
	p, state := newProvider(t)
	ctx := context.Background()
	cfg, leased := testConfig(), kit.CreateOptions{Leased: true}
	kept, err := p.CreateFor(ctx, cfg, leased)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, kept.ID)
	if err := p.Keep(ctx, kept.ID); err != nil {
		t.Fatalf("Keep: %v", err)
	}
	left, err := p.CreateFor(ctx, cfg, leased)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, left.ID)
	p.Close() // lets go of the lease of left, not of kept

	other, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// Inspect's load makes other watch the sandbox's PID 1, so other tears it down as
	// soon as it exits: it is seen exited or, after that, gone.
	testenv.Eventually(t, oci.LeaseGrace+30*time.Second, "the unleased sandbox to stop", func() bool {
		got, err := other.Inspect(ctx, left.ID)
		return err == nil && got.State == roche.StateExited || errors.Is(err, roche.ErrNotFound)
	})
	if got, err := other.Inspect(ctx, kept.ID); err != nil || got.State != roche.StateRunning {
		t.Fatalf("the kept sandbox: %+v %v, want running", got, err)
	}
}
