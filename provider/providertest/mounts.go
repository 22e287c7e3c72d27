package providertest

import (
	"slices"
	"strings"
	"testing"
)

// scratchMountsProbe prints, for /tmp and /dev/shm, the filesystem type and per-mount
// options of the mount on top at that point (from /proc/self/mountinfo), and what making
// a device node there (/dev/null's numbers) gives; then the process's NoNewPrivs.
const scratchMountsProbe = `
import errno, os, stat
top = {}
for line in open('/proc/self/mountinfo'):
    f = line.split()
    sep = f.index('-')
    top[f[4]] = (f[sep + 1], f[5])
for point in ('/tmp', '/dev/shm'):
    fstype, opts = top.get(point, ('none', 'none'))
    node = os.path.join(point, 'roche-null')
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        made = 'made'
        os.remove(node)
    except OSError as e:
        made = errno.errorcode.get(e.errno, str(e.errno))
    print(point, fstype, opts, made)
print('nnp', [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs:')][0])`

// testScratchMounts: /tmp and /dev/shm are tmpfs mounts with nosuid and nodev, as the
// secure defaults promise, read from inside. Where the backend cannot set them
// (Options.ScratchMountsLackNosuid), the check asserts that they are indeed absent, so
// that docs/providers/kubernetes.md's note stays true, and that what makes them moot holds: no device node
// can be made there, and no_new_privs makes set-user-ID files give nothing. gVisor's
// mountinfo never shows nodev (a device node in its tmpfs opens one of gVisor's own
// emulated devices, never the host's): there only nosuid is asked.
func (s *suite) testScratchMounts(t *testing.T, id string) {
	got := s.pyOK(t, id, scratchMountsProbe)
	lines := strings.Split(got, "\n")
	if len(lines) != 3 {
		t.Fatalf("probe printed %q", got)
	}
	gap := s.opts.ScratchMountsLackNosuid
	for _, line := range lines[:2] {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("probe printed %q", line)
		}
		point, fstype, opts, mknod := f[0], f[1], strings.Split(f[2], ","), f[3]
		if fstype != "tmpfs" {
			t.Errorf("%s is %s, want tmpfs", point, fstype)
		}
		flagged := slices.Contains(opts, "nosuid") && (slices.Contains(opts, "nodev") || s.opts.GVisor)
		switch {
		case gap == "" && !flagged:
			t.Errorf("%s mounted %s, want nosuid and nodev", point, f[2])
		case gap != "" && flagged:
			t.Errorf("%s mounted %s: it has nosuid and nodev now, which Options.ScratchMountsLackNosuid (%s) and docs/providers/kubernetes.md say it lacks: drop both", point, f[2], gap)
		case gap != "" && mknod != "EPERM":
			t.Errorf("%s has no nodev (%s), and making a device node there gave %s, want EPERM", point, gap, mknod)
		}
	}
	if gap != "" && lines[2] != "nnp 1" {
		t.Errorf("%s lacks nosuid (%s), and the sandbox's process has %q, want no_new_privs (nnp 1)", "/tmp", gap, lines[2])
	}
}
