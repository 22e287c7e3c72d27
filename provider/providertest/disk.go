package providertest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// The disk checks: a writable root holds at most Config.Disk and a workspace at most its
// size, and past either a write fails with ENOSPC inside the sandbox, as on a full disk.

// fillProbe writes up to 200 MiB, 1 MiB at a time, into a file in the directory it is
// given ("root": /var/tmp where the image has it, else /) and prints the errno it
// stopped at (or "unbounded") and the MiB written, then removes the file.
const fillProbe = `
import errno, os, sys
d = sys.argv[1]
if d == 'root':
    d = '/var/tmp' if os.path.isdir('/var/tmp') else '/'
path = os.path.join(d, 'roche-fill')
n = 0
try:
    with open(path, 'wb') as f:
        while n < (200 << 20):
            f.write(b'\x5a' * (1 << 20)); f.flush(); n += 1 << 20
    print('unbounded', n >> 20)
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno), n >> 20)
finally:
    if os.path.exists(path):
        os.remove(path)
`

// fill runs fillProbe on dir and returns where it stopped and the MiB written.
func (s *suite) fill(t *testing.T, id, dir string) (string, int) {
	t.Helper()
	got := s.pyOK(t, id, fillProbe, func(r *roche.ExecRequest) { r.Cmd = append(r.Cmd, dir); r.Timeout = 2 * time.Minute })
	fields := strings.Fields(got)
	if len(fields) != 2 {
		t.Fatalf("fill probe printed %q", got)
	}
	mib, _ := strconv.Atoi(fields[1])
	return fields[0], mib
}

func (s *suite) testDiskLimit(t *testing.T) {
	if !s.caps.Writable {
		t.Skip("provider cannot make the root writable (Capabilities.Writable is false)")
	}
	cfg := s.opts.Config
	cfg.Writable = true
	cfg.Disk = "100m"
	if s.opts.NoDiskLimit != "" {
		before := s.ids(t)
		_, err := s.p.Create(ctxFor(t, time.Minute), cfg)
		if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "disk") {
			t.Fatalf("writable with disk 100m on a provider without disk limits (%s): err %v, want ErrUnsupported naming disk", s.opts.NoDiskLimit, err)
		}
		s.noneMadeSince(t, before, "a refused Create")
		return
	}
	id := s.create(t, cfg)
	// The filesystem's own bookkeeping may take a little of the size.
	if stopped, mib := s.fill(t, id, "root"); stopped != "ENOSPC" || mib > 100 || mib < 80 {
		t.Fatalf("writing 200 MiB to a writable root with disk 100m: stopped at %s after %d MiB, want ENOSPC after 80 to 100", stopped, mib)
	}
	// Space freed is space again.
	if got := s.fillAgain(t, id); got != "written" {
		t.Fatalf("writing to the root after the fill was removed: %s", got)
	}
}

func (s *suite) fillAgain(t *testing.T, id string) string {
	return s.pyOK(t, id, "import os\nd = '/var/tmp' if os.path.isdir('/var/tmp') else '/'\nopen(os.path.join(d, 'again'), 'wb').write(b'x' * (10 << 20))\nprint('written')")
}

func (s *suite) testWorkspaceSize(t *testing.T) {
	wm := s.p.(roche.WorkspaceManager)
	name := uniqueName("wsize")
	s.removeWorkspaceAtEnd(t, wm, name)
	cfg := s.opts.Config
	cfg.Workspace = name
	cfg.WorkspaceSize = "50m"
	info, err := s.p.Create(ctxFor(t, 2*time.Minute), cfg)
	if errors.Is(err, roche.ErrUnsupported) {
		t.Skipf("the provider refuses workspaces here: %v", err)
	}
	if err != nil {
		t.Fatalf("Create with a 50m workspace: %v", err)
	}
	s.track(t, info.ID)
	if stopped, mib := s.fill(t, info.ID, roche.WorkspacePath); stopped != "ENOSPC" || mib > 50 || mib < 40 {
		t.Fatalf("writing 200 MiB to a 50m workspace: stopped at %s after %d MiB, want ENOSPC after 40 to 50", stopped, mib)
	}
	if ws := findWorkspace(t, wm, name); ws == nil || ws.SizeBytes != 50<<20 {
		t.Fatalf("workspace list shows %+v, want %s with a size of 50 MiB", ws, name)
	}
	// The size is the workspace's: a create asking for another is refused, not given it.
	other := cfg
	other.WorkspaceSize = "60m"
	before := s.ids(t)
	if _, err := s.p.Create(ctxFor(t, 2*time.Minute), other); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), name) {
		t.Fatalf("a create asking the 50m workspace %s for 60m: %v, want ErrInvalidConfig naming it", name, err)
	}
	s.noneMadeSince(t, before, "a refused Create")
}
