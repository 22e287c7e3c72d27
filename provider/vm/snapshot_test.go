//go:build linux

package vm_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/vm"
)

// cell runs code in the sandbox's default Python context and returns the text of its
// last expression, failing the test on any error.
func cell(t *testing.T, p roche.CodeRunner, id, code string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ex, err := p.RunCode(ctx, id, roche.CodeRequest{Code: code})
	if err != nil {
		t.Fatalf("%s: run_code %q: %v", id, code, err)
	}
	if ex.Error != nil {
		t.Fatalf("%s: run_code %q: %s: %s", id, code, ex.Error.Name, ex.Error.Value)
	}
	if ex.Restarted {
		t.Fatalf("%s: run_code %q: the interpreter was restarted: its state was lost", id, code)
	}
	for _, r := range ex.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// TestMemorySnapshots pauses a VM to disk, forks it while paused, resumes it from
// another provider (as roched after a restart would), and forks it again while it runs: a code context's variables, a background
// thread, an open file and a file written before the pause are in each, and every VM
// draws its own randomness.
func TestMemorySnapshots(t *testing.T) {
	// The saved memory would be on a disk; a tmpfs here keeps the test off the shared
	// machine's disk, which other work fills.
	stateDir := t.TempDir()
	ramDir, memDir := shmDir(t), shmDir(t)
	opts := []vm.Option{vm.WithStateDir(stateDir), vm.WithMemoryDir(memDir), vm.WithRAMDir(ramDir)}
	p := newQEMU(t, opts...)
	ctx := context.Background()
	info, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	var made []string
	t.Cleanup(func() {
		for _, id := range append(made, id) {
			_ = p.Destroy(context.Background(), id)
		}
	})

	cell(t, p, id, `
import os, threading, time, socket, random
random.seed(1)  # every copy of this memory holds the generator's state
x = 41
n = 0
def count():
    global n
    while True:
        n += 1
        time.sleep(0.01)
threading.Thread(target=count, daemon=True).start()
f = open('/tmp/open.txt', 'w')
f.write('a')
f.flush()
with open('/tmp/before.txt', 'w') as g:
    g.write('written before the pause')
`)
	before := cell(t, p, id, "os.urandom(16).hex()")

	if err := p.PauseToDisk(ctx, id); err != nil {
		t.Fatalf("PauseToDisk: %v", err)
	}
	if got, err := p.Inspect(ctx, id); err != nil || got.State != roche.StatePaused {
		t.Fatalf("Inspect after PauseToDisk: %+v, %v; want paused", got, err)
	}
	// Paused to disk, the VM holds no memory or CPU: no process of it is left, and its
	// RAM file is gone from the tmpfs.
	if procs := processesNaming(id); len(procs) > 0 {
		t.Fatalf("paused to disk, the VM still runs:\n%s", strings.Join(procs, "\n"))
	}
	if left, _ := os.ReadDir(ramDir); len(left) > 0 {
		t.Fatalf("paused to disk, the VM's RAM is still in %s: %v", ramDir, left)
	}
	if _, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"true"}}); err == nil || !strings.Contains(err.Error(), "resume") {
		t.Fatalf("exec in a VM paused to disk: %v, want an error that says to resume it", err)
	}

	// Another provider, as after a restart of roched, resumes it from its files alone.
	p.Close()
	p2, err := vm.NewQEMU(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p2.Close() })
	p = p2
	// A fork of the paused VM maps its saved RAM file privately, as its resume does.
	fromPaused, err := p.Fork(ctx, id, 1)
	if err != nil {
		t.Fatalf("Fork of a VM paused to disk: %v", err)
	}
	made = append(made, fromPaused[0].ID)
	start := time.Now()
	if _, err := p.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	t.Logf("resumed in %v", time.Since(start).Round(time.Millisecond))
	if got := cell(t, p, id, "x + 1"); got != "42" {
		t.Fatalf("after resume, x + 1 = %q, want 42", got)
	}
	if got := cell(t, p, id, "c = n\ntime.sleep(0.3)\nn > c"); got != "True" {
		t.Fatalf("after resume, the background counter stopped (n > c: %s)", got)
	}
	if got := cell(t, p, id, "f.write('b')\nf.close()\nopen('/tmp/open.txt').read()"); got != "'ab'" {
		t.Fatalf("the file open across the pause: %s, want 'ab'", got)
	}
	if got := cell(t, p, id, "open('/tmp/before.txt').read()"); got != "'written before the pause'" {
		t.Fatalf("the file written before the pause: %s", got)
	}
	resumed := cell(t, p, id, "os.urandom(16).hex()")
	if resumed == before {
		t.Fatalf("os.urandom repeated itself across the resume: %s", resumed)
	}

	// A fork of the running VM, itself restored (its RAM private): the RAM goes
	// through the saved stream.
	fromRunning, err := p.Fork(ctx, id, 1)
	if err != nil {
		t.Fatalf("Fork of a running VM: %v", err)
	}
	made = append(made, fromRunning[0].ID)
	forks := append(fromPaused, fromRunning...)
	if len(forks) != 2 {
		t.Fatalf("two Fork(1) made %d sandboxes", len(forks))
	}
	seen := map[string]string{id: cell(t, p, id, "os.urandom(16).hex()")}
	// Python's random module, seeded before the snapshots, was reseeded in each copy.
	draws := map[string]string{id: cell(t, p, id, "random.random()")}
	for _, f := range forks {
		r := cell(t, p, f.ID, "random.random()")
		for other, v := range draws {
			if v == r {
				t.Fatalf("fork %s drew the same random.random() as %s: %s", f.ID, other, r)
			}
		}
		draws[f.ID] = r
	}
	for i, f := range forks {
		if f.ID == id || f.ID == forks[1-i].ID {
			t.Fatalf("fork %d has id %s, not a new one", i, f.ID)
		}
		if got := cell(t, p, f.ID, "x + 1"); got != "42" {
			t.Fatalf("fork %s: x + 1 = %q, want 42", f.ID, got)
		}
		if got := cell(t, p, f.ID, "open('/tmp/before.txt').read()"); got != "'written before the pause'" {
			t.Fatalf("fork %s: the file written before the pause: %s", f.ID, got)
		}
		if got := cell(t, p, f.ID, "socket.gethostname()"); got != "'"+f.ID+"'" {
			t.Fatalf("fork %s: hostname %s, want its own id", f.ID, got)
		}
		u := cell(t, p, f.ID, "os.urandom(16).hex()")
		for other, v := range seen {
			if v == u {
				t.Fatalf("fork %s drew the same os.urandom(16) as %s: %s", f.ID, other, u)
			}
		}
		seen[f.ID] = u
	}
	// Each fork's state diverges on its own, and none sees another's files.
	cell(t, p, forks[0].ID, "x = 100\nopen('/tmp/mine.txt', 'w').write('0')")
	if got := cell(t, p, forks[1].ID, "x"); got != "41" {
		t.Fatalf("fork 1 sees fork 0's x: %s", got)
	}
	if got := cell(t, p, id, "x, os.path.exists('/tmp/mine.txt')"); got != "(41, False)" {
		t.Fatalf("the origin sees fork 0's state: %s", got)
	}

	// Everything removed leaves nothing on disk.
	for _, id := range append(made, id) {
		if err := p.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{stateDir, memDir, ramDir} {
		if left, _ := os.ReadDir(dir); len(left) > 0 {
			t.Errorf("left in %s after destroying every sandbox: %v", dir, left)
		}
	}
}

func shmDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "roche-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestForkRefusals: bad counts and unknown sandboxes are one clear error each.
func TestForkRefusals(t *testing.T) {
	p, err := vm.NewQEMU(vm.WithStateDir(t.TempDir()), vm.WithMemoryDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if _, err := p.Fork(ctx, "qemu-000000000000", 0); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("Fork(0): %v, want ErrInvalidConfig", err)
	}
	if _, err := p.Fork(ctx, "qemu-000000000000", roche.MaxForks+1); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("Fork(MaxForks+1): %v, want ErrInvalidConfig", err)
	}
	if _, err := p.Fork(ctx, "qemu-000000000000", 1); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("Fork of no sandbox: %v, want ErrNotFound", err)
	}
	if _, err := p.Resume(ctx, "qemu-000000000000"); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("Resume of no sandbox: %v, want ErrNotFound", err)
	}
	if err := p.PauseToDisk(ctx, "qemu-000000000000"); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("PauseToDisk of no sandbox: %v, want ErrNotFound", err)
	}
}

// TestPoolFromSnapshot: a code=python pool of two qemu VMs refills by restoring a memory
// snapshot of one VM with its interpreter started, not by booting: each member is a
// restore (its RAM a private mapping of the template's file), with its own id, hostname,
// os.urandom and Python random; a claimed member runs code at once in the warm
// interpreter; the pool refills the member taken from the same snapshot; drained and
// closed, it leaves nothing on disk.
func TestPoolFromSnapshot(t *testing.T) {
	stateDir := t.TempDir()
	ramDir, memDir := shmDir(t), shmDir(t)
	p := newQEMU(t, vm.WithStateDir(stateDir), vm.WithMemoryDir(memDir), vm.WithRAMDir(ramDir))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec, err := pool.ParseSpec("qemu/" + testenv.Image() + "?min=2&max=2&code=python")
	if err != nil {
		t.Fatal(err)
	}
	m, err := pool.NewManager(map[string]roche.Provider{"qemu": p}, []pool.Spec{spec}, pool.WithOwner("test:pool-snapshot"), pool.WithConcurrency(2))
	if err != nil {
		t.Fatal(err)
	}
	var taken string
	t.Cleanup(func() {
		_, _ = m.Close(context.Background())
		if taken != "" {
			_ = p.Destroy(context.Background(), taken)
		}
	})
	m.Start()
	pl := m.Pools()[0]
	if err := pl.Warmup(ctx, 2); err != nil {
		t.Fatal(err)
	}
	templates := func() []string {
		var out []string
		entries, _ := os.ReadDir(memDir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "snap-") {
				out = append(out, e.Name())
			}
		}
		return out
	}
	tmpl := templates()
	if len(tmpl) != 1 {
		t.Fatalf("the pool keeps %d memory snapshots (%v), want 1", len(tmpl), tmpl)
	}
	restored := func(id string) bool {
		b, err := os.ReadFile(filepath.Join(stateDir, id, "meta.json"))
		if err != nil {
			t.Fatalf("member %s: %v", id, err)
		}
		var m struct {
			MemPrivate bool `json:"mem_private"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m.MemPrivate
	}
	ids := pl.IdleIDs()
	if len(ids) != 2 {
		t.Fatalf("idle members %v, want 2", ids)
	}
	seen := map[string]string{}
	for _, id := range ids {
		if !restored(id) {
			t.Fatalf("member %s was booted, not restored from the pool's snapshot", id)
		}
		if got := cell(t, p, id, "import socket\nsocket.gethostname()"); got != "'"+id+"'" {
			t.Fatalf("member %s: hostname %s, want its own id", id, got)
		}
		u := cell(t, p, id, "import os\nos.urandom(16).hex()")
		for other, v := range seen {
			if v == u {
				t.Fatalf("members %s and %s drew the same os.urandom(16): %s", id, other, u)
			}
		}
		seen[id] = u
	}

	sb, ok := pl.Acquire(ctx)
	if !ok {
		t.Fatal("Acquire found no idle member")
	}
	taken = sb.ID
	ex, err := p.RunCode(ctx, sb.ID, roche.CodeRequest{Code: "sum(range(10))"})
	if err != nil || ex.Error != nil || ex.Restarted {
		t.Fatalf("a cell in the claimed member: %+v, %v", ex, err)
	}
	if len(ex.Results) == 0 || ex.Results[0].Text != "45" {
		t.Fatalf("a cell in the claimed member: results %+v, want 45", ex.Results)
	}
	// The pool refills the member taken, from the same snapshot.
	if err := pl.Warmup(ctx, 2); err != nil {
		t.Fatal(err)
	}
	for _, id := range pl.IdleIDs() {
		if !restored(id) {
			t.Fatalf("refilled member %s was booted, not restored", id)
		}
	}
	if got := templates(); len(got) != 1 || got[0] != tmpl[0] {
		t.Fatalf("after a refill the pool's snapshots are %v, want %v", got, tmpl)
	}
	if _, err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, taken); err != nil {
		t.Fatal(err)
	}
	taken = ""
	for _, dir := range []string{stateDir, memDir, ramDir} {
		if left, _ := os.ReadDir(dir); len(left) > 0 {
			t.Errorf("left in %s after the pool closed: %v", dir, left)
		}
	}
}
