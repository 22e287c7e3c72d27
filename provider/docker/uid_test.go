package docker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
)

// uidOfSandbox returns the uid and gid commands run as inside, and the uid label.
func uidOfSandbox(t *testing.T, p *docker.Provider, id string) (uid, gid int, label string) {
	t.Helper()
	f := strings.Fields(execOK(t, p, id, "sh", "-c", "id -u; id -g"))
	if len(f) != 2 {
		t.Fatalf("id inside: %q", f)
	}
	uid, _ = strconv.Atoi(f[0])
	gid, _ = strconv.Atoi(f[1])
	ins, err := engineClient(t).ContainerInspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return uid, gid, ins.Config.Labels[docker.LabelUID]
}

// holdersOf lists the containers labelled with uid.
func holdersOf(t *testing.T, uid int) []string {
	t.Helper()
	cs, err := engineClient(t).ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", docker.LabelUID+"="+strconv.Itoa(uid)))})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids
}

// TestSandboxesGetUIDsOfTheirOwn: sandboxes made at the same time with the default user
// each run as a uid of their own from the sandbox half of the range, recorded in their
// label, with HOME writable; the uid is free again once the sandbox is gone. A user the
// caller names is honoured.
func TestSandboxesGetUIDsOfTheirOwn(t *testing.T) {
	p := newProvider(t)
	ids := make([]string, 4)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info, err := p.Create(context.Background(), testConfig())
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = info.ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != "" {
			t.Cleanup(func() { p.Destroy(context.Background(), id) })
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	seen := map[int]bool{}
	for _, id := range ids {
		uid, gid, label := uidOfSandbox(t, p, id)
		if uid < docker.DefaultUIDFirst || uid >= docker.DefaultUIDFirst+docker.DefaultUIDCount/2 || gid != uid {
			t.Errorf("sandbox runs as %d:%d, want uid=gid from %d-%d", uid, gid, docker.DefaultUIDFirst, docker.DefaultUIDFirst+docker.DefaultUIDCount/2-1)
		}
		if label != strconv.Itoa(uid) {
			t.Errorf("label %s=%q, uid inside %d", docker.LabelUID, label, uid)
		}
		if seen[uid] {
			t.Errorf("uid %d given to two sandboxes", uid)
		}
		seen[uid] = true
		if got := execOK(t, p, id, "sh", "-c", `echo "$HOME"; touch "$HOME/.probe" && echo writable`); got != "/tmp\nwritable\n" {
			t.Errorf("HOME: %q, want /tmp, writable", got)
		}
	}
	uid, _, _ := uidOfSandbox(t, p, ids[0])
	if err := p.Destroy(context.Background(), ids[0]); err != nil {
		t.Fatal(err)
	}
	if h := holdersOf(t, uid); len(h) != 0 {
		t.Fatalf("uid %d still held after its sandbox was destroyed: %v", uid, h)
	}

	cfg := testConfig()
	cfg.User = "1234:4321"
	cfg.Env = map[string]string{"HOME": "/tmp/mine"}
	id := sandbox(t, p, cfg)
	if uid, gid, label := uidOfSandbox(t, p, id); uid != 1234 || gid != 4321 || label != "1234" {
		t.Fatalf("user 1234:4321 runs as %d:%d, label %q", uid, gid, label)
	}
	if got := execOK(t, p, id, "sh", "-c", `echo "$HOME"`); got != "/tmp/mine\n" {
		t.Fatalf("HOME set in the config: %q", got)
	}
}

// inotifyAttack has sandbox a take every inotify instance its uid may have and hold
// them while sandbox b tries to get one, and returns what b got ("ok" or an errno).
func inotifyAttack(t *testing.T, p *docker.Provider, a, b string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w := &firstLine{c: held}
		p.Exec(ctx, a, roche.ExecRequest{Cmd: []string{"python3", "-c", `
import ctypes, errno, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 100000:
    if libc.inotify_init1(0) < 0:
        break
    n += 1
print(n, errno.errorcode.get(ctypes.get_errno()), flush=True)
time.sleep(600)`}, Stdout: w, Timeout: 5 * time.Minute})
	}()
	defer func() { cancel(); <-done }()
	select {
	case got := <-held:
		if !strings.HasSuffix(got, " EMFILE") {
			t.Fatalf("sandbox A did not run out of inotify instances: %q", got)
		}
	case <-done:
		t.Fatal("sandbox A's program ended early")
	case <-time.After(2 * time.Minute):
		t.Fatal("sandbox A printed nothing")
	}
	return strings.TrimSpace(execOK(t, p, b, "python3", "-c", `
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
print('ok' if libc.inotify_init1(0) >= 0 else errno.errorcode.get(ctypes.get_errno()))`))
}

type firstLine struct {
	mu  sync.Mutex
	buf strings.Builder
	c   chan string
}

func (w *firstLine) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if line, _, ok := strings.Cut(w.buf.String(), "\n"); ok && w.c != nil {
		w.c <- line
		w.c = nil
	}
	return len(b), nil
}

// TestPerUserLimitsAttack: the attack from the issue, both ways. Two sandboxes given
// the same uid share its inotify instances (fs.inotify.max_user_instances is per uid):
// one that takes them all leaves the other none. With the default user they are apart.
func TestPerUserLimitsAttack(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fs.inotify.max_user_instances = %s", strings.TrimSpace(string(b)))
	p := newProvider(t)
	shared := testConfig()
	// A uid outside Roche's ranges that no host user has.
	u := docker.DefaultUIDFirst + docker.DefaultUIDCount + 1000 + rand.IntN(1000)
	shared.User = fmt.Sprintf("%d:%d", u, u)
	if got := inotifyAttack(t, p, sandbox(t, p, shared), sandbox(t, p, shared)); got != "EMFILE" {
		t.Fatalf("two sandboxes with the same uid: the second got %q, want EMFILE: the attack does not work, so the check below proves nothing", got)
	}
	if got := inotifyAttack(t, p, sandbox(t, p, testConfig()), sandbox(t, p, testConfig())); got != "ok" {
		t.Fatalf("two sandboxes with the default user: the second got %q while the first holds every instance of its uid, want ok", got)
	}
}

// TestUIDTakenIsDrawnAgain: a uid is checked against every other container once its
// sandbox's container carries it, whichever process made that one; a taken uid is drawn
// again, and when none is free Create says so and leaves nothing behind. Separate
// providers stand for separate processes: nothing but the engine and the state
// directory is shared between them. p1 watches the engine's events, as roched does:
// the containers p2 undoes to draw again must not take the agent directory of the
// one p2 makes next (they carried it).
func TestUIDTakenIsDrawnAgain(t *testing.T) {
	// Ranges of a few uids, of their own, outside the default one; a state directory
	// of its own, so that watchers of other processes on the engine stay out.
	first := docker.DefaultUIDFirst + docker.DefaultUIDCount + 10_000 + 100*rand.IntN(1000)
	state := docker.WithStateDir(t.TempDir())
	p1 := newProvider(t, docker.WithUIDRange(first, 2), state) // one uid for sandboxes
	p2 := newProvider(t, docker.WithUIDRange(first, 2), state)
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	events, err := p1.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range events {
		}
	}()
	a := sandbox(t, p1, testConfig())
	if uid, _, _ := uidOfSandbox(t, p1, a); uid != first {
		t.Fatalf("uid %d, want %d, the only one", uid, first)
	}
	_, err = p2.Create(context.Background(), testConfig())
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "no free uid") {
		t.Fatalf("a second sandbox with no uid free: %v, want ErrUnavailable saying no free uid", err)
	}
	if h := holdersOf(t, first); len(h) != 1 || h[0] != a {
		t.Fatalf("containers holding uid %d after the refused create: %v, want only %s", first, h, a)
	}
	if err := p1.Destroy(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	b := sandbox(t, p2, testConfig())
	if uid, _, _ := uidOfSandbox(t, p2, b); uid != first {
		t.Fatalf("uid %d once freed: a new sandbox got %d", first, uid)
	}

	// Two processes racing for 4 uids: collisions are common, and each is resolved.
	first += 100
	p3 := newProvider(t, docker.WithUIDRange(first, 8), state)
	p4 := newProvider(t, docker.WithUIDRange(first, 8), state)
	for round := range 5 {
		ids := make([]string, 2)
		var wg sync.WaitGroup
		for i, p := range []*docker.Provider{p3, p4} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				info, err := p.Create(context.Background(), testConfig())
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				ids[i] = info.ID
			}()
		}
		wg.Wait()
		var uids []int
		for _, id := range ids {
			if id != "" {
				uid, _, _ := uidOfSandbox(t, p3, id)
				uids = append(uids, uid)
				p3.Destroy(context.Background(), id)
			}
		}
		if len(uids) == 2 && uids[0] == uids[1] {
			t.Fatalf("round %d: both sandboxes got uid %d", round, uids[0])
		}
	}
	for u := first; u < first+4; u++ {
		if h := holdersOf(t, u); len(h) != 0 {
			t.Fatalf("uid %d still held after the race: %v", u, h)
		}
	}
}

// TestWorkspaceUID: a workspace has a uid of its own, from the workspace half of the
// range: every sandbox that mounts it runs as that uid, so what one leaves there, with
// any mode, the next can change, and two at once can change each other's files; a
// sandbox without it has another uid.
func TestWorkspaceUID(t *testing.T) {
	p := newProvider(t)
	ctx := context.Background()
	name := workspaceName(t)
	removeAtEnd(t, "workspace", p.RemoveWorkspace, name)
	cfg := testConfig()
	cfg.Workspace = name

	first, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(ctx, first.ID) })
	wsUID, gid, label := uidOfSandbox(t, p, first.ID)
	half := docker.DefaultUIDFirst + docker.DefaultUIDCount/2
	if wsUID < half || wsUID >= docker.DefaultUIDFirst+docker.DefaultUIDCount || gid != wsUID || label != strconv.Itoa(wsUID) {
		t.Fatalf("sandbox with the workspace runs as %d:%d (label %s), want a workspace uid from %d up", wsUID, gid, label, half)
	}
	if got := execOK(t, p, first.ID, "sh", "-c", "stat -c %u /workspace; umask 077; echo private > /workspace/private; mkdir /workspace/d; echo old > /workspace/d/f; stat -c %a /workspace/private"); got != fmt.Sprintf("%d\n600\n", wsUID) {
		t.Fatalf("owner of /workspace, mode of a file made in it: %q", got)
	}
	if err := p.Destroy(ctx, first.ID); err != nil {
		t.Fatal(err)
	}

	other := sandbox(t, p, testConfig())
	if uid, _, _ := uidOfSandbox(t, p, other); uid == wsUID {
		t.Fatalf("a sandbox without the workspace got its uid %d", wsUID)
	}

	second := sandbox(t, p, cfg)
	third := sandbox(t, p, cfg)
	if got := execOK(t, p, second, "sh", "-c", "cat /workspace/private; echo changed > /workspace/private; echo new > /workspace/d/g; rm /workspace/d/f; umask 077; echo from-second > /workspace/second; ls /workspace/d"); got != "private\ng\n" {
		t.Fatalf("the next sandbox with the workspace: %q", got)
	}
	if got := execOK(t, p, third, "sh", "-c", "cat /workspace/private; echo from-third >> /workspace/second; cat /workspace/second"); got != "changed\nfrom-second\nfrom-third\n" {
		t.Fatalf("a sandbox with the workspace at the same time: %q", got)
	}
}

// TestSnapshotFilesStayWritable: a sandbox made from a snapshot of a writable sandbox
// has another uid than the one the snapshot was taken of, yet owns what that one wrote
// on the root filesystem and in /tmp, whatever its mode, and can change and remove it.
// The hand-over stays on the snapshot's files: root's files, and a host file bound in
// that belongs to the old uid, keep their owners.
func TestSnapshotFilesStayWritable(t *testing.T) {
	p := newProvider(t, docker.WithDataDir(t.TempDir()))
	ctx := context.Background()
	name := fmt.Sprintf("test-%d", time.Now().UnixNano()%1e9)
	removeAtEnd(t, "snapshot", p.RemoveSnapshot, name)
	cfg := testConfig()
	cfg.Writable = true
	src := sandbox(t, p, cfg)
	srcUID, _, _ := uidOfSandbox(t, p, src)
	execOK(t, p, src, "sh", "-c", "umask 077; mkdir -p /var/tmp/d; echo root-fs > /var/tmp/d/f; echo gone > /var/tmp/g; echo tmp > /tmp/t")
	if _, err := p.Snapshot(ctx, src, name); err != nil {
		t.Fatal(err)
	}

	// A host file that belongs to the old uid, bound into the new sandbox: the agent's
	// hand-over must not reach through the mount.
	host := t.TempDir()
	victim := filepath.Join(host, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(victim, srcUID, srcUID); err != nil {
		t.Fatal(err)
	}
	from := testConfig()
	from.Writable = true
	from.FromSnapshot = name
	from.Mounts = []roche.Mount{{Source: host, Target: "/mnt/host", ReadWrite: true}, {Source: victim, Target: "/mnt/file", ReadWrite: true}}
	dst := sandbox(t, p, from)
	dstUID, _, label := uidOfSandbox(t, p, dst)
	if dstUID == srcUID || label != strconv.Itoa(dstUID) {
		t.Fatalf("the snapshot's sandbox runs as %d (label %s), the sandbox it was taken of as %d: want a uid of its own", dstUID, label, srcUID)
	}
	got := execOK(t, p, dst, "sh", "-c", "cat /var/tmp/d/f; echo changed > /var/tmp/d/f; echo new > /var/tmp/d/new; rm /var/tmp/g; cat /tmp/t; echo more >> /tmp/t; stat -c %u /var/tmp/d /etc/passwd /mnt/host/victim /mnt/file")
	want := fmt.Sprintf("root-fs\ntmp\n%d\n0\n%d\n%d\n", dstUID, srcUID, srcUID)
	if got != want {
		t.Fatalf("in the snapshot's sandbox: %q, want %q", got, want)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(victim, &st); err != nil || int(st.Uid) != srcUID {
		t.Fatalf("the host file bound in: owner %d (%v), want %d still", st.Uid, err, srcUID)
	}
}
