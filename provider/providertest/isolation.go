package providertest

import (
	"encoding/json"
	"testing"
	"time"
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
            open('/proc/%s/%s' % (pid, f), 'rb').read(1)
            r[f] = 'read'
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
				// its descriptors, not what they are): the README's gVisor table says so.
				if outcome != want {
					t.Logf("gVisor: PID %s's fdinfo %s, as documented", pid, outcome)
				}
				continue
			}
			if outcome != want && !(outcome == "ENOENT" && what != "signal") {
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
