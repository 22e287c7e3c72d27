package providertest

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// otherProcessesProbe tries, for every process in /proc that does not run as the
// sandbox user (roche-agent, where a provider runs it), what only a debugger of that
// process may do: read its environment, memory maps, auxiliary vector and memory, list
// its descriptors, enter its root and working directory, and signal it. It prints
// {pid: {what: "read" or the errno}}.
const otherProcessesProbe = `
import errno, json, os
me = os.getuid()
def err(e): return errno.errorcode.get(e.errno, str(e.errno))
out = {}
for pid in sorted((p for p in os.listdir('/proc') if p.isdigit()), key=int):
    try:
        uid = int([l for l in open('/proc/%s/status' % pid) if l.startswith('Uid:')][0].split()[1])
    except (OSError, IndexError):
        continue
    if uid == me:
        continue
    r = {}
    for f in ('environ', 'maps', 'auxv', 'smaps', 'mem'):
        try:
            # A kernel thread has no memory: its maps read empty, which tells nothing.
            r[f] = 'read' if open('/proc/%s/%s' % (pid, f), 'rb').read(1) else 'empty'
        except OSError as e:
            r[f] = err(e)
    for d in ('fd', 'fdinfo', 'root', 'cwd', 'task/%s/fd' % pid):
        try:
            os.listdir('/proc/%s/%s' % (pid, d))
            r[d] = 'listed'
        except OSError as e:
            r[d] = err(e)
    try:
        os.kill(int(pid), 0)
        r['signal'] = 'allowed'
    except OSError as e:
        r['signal'] = err(e)
    out[pid] = r
print(json.dumps(out))`

// testOtherProcesses: the sandbox user cannot look into, or signal, a process that is
// not its own: the agent (PID 1 where a provider runs it) holds the sandbox's control
// socket and the environment it was started with. Linux refuses it all with EACCES
// (EPERM to a signal) for a process of another uid the caller may not trace. A sandbox
// served by the agent must show at least one such process, or the check proves nothing.
func (s *suite) testOtherProcesses(t *testing.T, id string) {
	got := s.pyOK(t, id, otherProcessesProbe)
	var procs map[string]map[string]string
	if err := json.Unmarshal([]byte(got), &procs); err != nil {
		t.Fatalf("probe printed %q: %v", got, err)
	}
	info, err := s.p.Inspect(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Transport == "agent" && len(procs) == 0 {
		t.Fatal("no process of another user is visible, yet roche-agent serves this sandbox: the check would prove nothing")
	}
	for pid, r := range procs {
		for what, outcome := range r {
			want := "EACCES"
			switch {
			case what == "signal":
				want = "EPERM"
			case what == "fdinfo" && s.opts.GVisor:
				// gVisor lists another process's fdinfo (numbers, positions and flags of
				// its descriptors, not what they are): docs/providers/docker.md's gVisor table says so.
				if outcome != want {
					t.Logf("gVisor: PID %s's fdinfo %s, as documented", pid, outcome)
				}
				continue
			}
			if outcome != want && outcome != "empty" && !(outcome == "ENOENT" && what != "signal") {
				t.Errorf("PID %s (another user's) %s from inside: %s, want %s", pid, what, outcome, want)
			}
		}
	}
	t.Logf("processes of other users probed: %d", len(procs))
}

// mknodProbe makes a character device, a block device and a FIFO in /tmp.
const mknodProbe = `
import errno, os, stat
out = []
for name, kind in (('chr', stat.S_IFCHR), ('blk', stat.S_IFBLK), ('fifo', stat.S_IFIFO)):
    p = '/tmp/roche-mknod-' + name
    try:
        os.mknod(p, 0o600 | kind, os.makedev(1, 3))
        os.unlink(p)
        out.append(name + '=made')
    except OSError as e:
        out.append(name + '=' + errno.errorcode.get(e.errno, str(e.errno)))
print(' '.join(out))`

// testMknod: without CAP_MKNOD no device node can be made (a device of the host's, or of
// gVisor's, opened from a writable directory); a FIFO, which needs no privilege, can.
func (s *suite) testMknod(t *testing.T, id string) {
	got := s.pyOK(t, id, mknodProbe)
	if got != "chr=EPERM blk=EPERM fifo=made" {
		t.Fatalf("mknod inside the sandbox: %q, want chr=EPERM blk=EPERM fifo=made", got)
	}
}

// openFilesProbe reads the open-file limit, tries to raise it, then opens /dev/null until
// refused and prints: soft hard raise-outcome opened error highest-fd.
const openFilesProbe = `
import errno, os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1))
    raised = 'raised'
except (ValueError, OSError):
    raised = 'refused'
fds, err = [], 'none'
try:
    while len(fds) < 1 << 21:
        fds.append(os.open('/dev/null', os.O_RDONLY))
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print(soft, hard, raised, len(fds), err, max(fds) if fds else -1)`

// testOpenFiles: every process in a sandbox is held to roche.DefaultOpenFiles open files,
// soft and hard: raising the hard limit is refused, and the open past it fails with
// EMFILE. With the PID limit, that bounds the files one sandbox holds on the host.
func (s *suite) testOpenFiles(t *testing.T, id string) {
	got := s.pyOK(t, id, openFilesProbe)
	f := strings.Fields(got)
	if len(f) != 6 {
		t.Fatalf("probe printed %q", got)
	}
	want := strconv.Itoa(roche.DefaultOpenFiles)
	if f[0] != want || f[1] != want {
		t.Errorf("RLIMIT_NOFILE %s soft, %s hard, want %s both", f[0], f[1], want)
	}
	if f[2] != "refused" {
		t.Errorf("raising the hard open-file limit from inside: %s, want refused", f[2])
	}
	if f[4] != "EMFILE" || f[5] != strconv.Itoa(roche.DefaultOpenFiles-1) {
		t.Errorf("opened %s files, the highest descriptor %s, then %s: want EMFILE at descriptor %d", f[3], f[5], f[4], roche.DefaultOpenFiles-1)
	}
}

// pidsProbe reads the process limit everywhere a program may (RLIMIT_NPROC,
// /proc/self/limits, the pids cgroup), then forks children that wait until it cannot,
// and prints it all as JSON.
const pidsProbe = `
import json, os, resource, time
out = {'rlimit': list(resource.getrlimit(resource.RLIMIT_NPROC)), 'cgroup': {}}
for l in open('/proc/self/limits'):
    if l.startswith('Max processes'):
        out['limits'] = l.split()[2:4]
paths = ['/sys/fs/cgroup/pids/pids.max', '/sys/fs/cgroup/pids.max']
for l in open('/proc/self/cgroup'):
    n, ctrl, path = l.rstrip('\n').split(':', 2)
    if ctrl == '':
        paths.append('/sys/fs/cgroup' + path.rstrip('/') + '/pids.max')
    elif 'pids' in ctrl.split(','):
        paths.append('/sys/fs/cgroup/pids' + path.rstrip('/') + '/pids.max')
for p in paths:
    try: out['cgroup'][p] = open(p).read().strip()
    except OSError: pass
kids = []
try:
    for _ in range(500):
        pid = os.fork()
        if pid == 0:
            time.sleep(60); os._exit(0)
        kids.append(pid)
except OSError as e:
    out['refused'] = e.strerror
out['forked'] = len(kids)
for k in kids: os.kill(k, 9)
for k in kids: os.waitpid(k, 0)
print(json.dumps(out))`

// testPidsExact: the sandbox's programs get exactly the PID limit (the program forking,
// and one fewer children), and every limit a program may read says that number: the
// limit that holds is the one a program sees (Options.PidsExact).
func (s *suite) testPidsExact(t *testing.T) {
	const limit = 20
	cfg := s.opts.Config
	cfg.PidsLimit = limit
	id := s.create(t, cfg)
	got := s.pyOK(t, id, pidsProbe)
	var r struct {
		Rlimit  []int64           `json:"rlimit"`
		Limits  []string          `json:"limits"`
		Cgroup  map[string]string `json:"cgroup"`
		Refused string            `json:"refused"`
		Forked  int               `json:"forked"`
	}
	if err := json.Unmarshal([]byte(got), &r); err != nil {
		t.Fatalf("probe printed %q: %v", got, err)
	}
	t.Logf("pids_limit %d inside: %s", limit, got)
	if len(r.Rlimit) != 2 || r.Rlimit[0] != limit || r.Rlimit[1] != limit {
		t.Errorf("RLIMIT_NPROC %v, want %d soft and hard", r.Rlimit, limit)
	}
	if len(r.Limits) != 2 || r.Limits[0] != strconv.Itoa(limit) || r.Limits[1] != strconv.Itoa(limit) {
		t.Errorf("/proc/self/limits says %v processes, want %d", r.Limits, limit)
	}
	for p, v := range r.Cgroup {
		if v != strconv.Itoa(limit) {
			t.Errorf("%s reads %q inside, where the limit that holds is %d", p, v, limit)
		}
	}
	if r.Refused == "" || r.Forked != limit-1 {
		t.Errorf("forked %d children (refused: %q), want exactly %d beside the program itself", r.Forked, r.Refused, limit-1)
	}
}
