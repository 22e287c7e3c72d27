package oci_test

import (
	"context"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/oci"
)

// TestCgroupfsReadOnly: inside a sandbox, on either runtime, /sys/fs/cgroup (the tmpfs
// the runtime puts the controllers on; crun makes it mode 1777) refuses writes with
// EROFS, to the sandbox's user and to root alike, and so do the controllers below it
// (EACCES first for the sandbox's user, whose they are not), while the agent still reads
// its memory controller (how it reports OOM kills).
func TestCgroupfsReadOnly(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	const probe = `
import errno, os
def try_(name, f):
    try:
        f()
        print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
try_("create", lambda: open("/sys/fs/cgroup/planted", "w").close())
try_("mkdir", lambda: os.mkdir("/sys/fs/cgroup/planted.d"))
try_("controller", lambda: open("/sys/fs/cgroup/memory/planted", "w").close())
try_("pids.max", lambda: open("/sys/fs/cgroup/pids/pids.max", "w").write("max"))
print("oom_control", os.access("/sys/fs/cgroup/memory/memory.oom_control", os.R_OK))
top = {}
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if f[4] == "/sys/fs/cgroup" or f[4].startswith("/sys/fs/cgroup/"):
        top[f[4]] = f[5].split(",")[0]
print("writable mounts", sorted(k for k, v in top.items() if v != "ro"))
`
	for _, rt := range oci.Runtimes() {
		if rt == oci.RuntimeRunsc {
			continue // refused, TestRunscRefused
		}
		for who, user := range map[string]string{"sandbox-user": roche.UserAuto, "root": "0:0"} {
			t.Run(rt+"/"+who, func(t *testing.T) {
				p, _ := newProvider(t, oci.WithRuntime(rt))
				ctx := context.Background()
				cfg := testConfig()
				cfg.User = user
				info, err := p.Create(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Destroy(ctx, info.ID)
				res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", probe}})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("probe: %+v %v", res, err)
				}
				want := "create EROFS\nmkdir EROFS\ncontroller EROFS\npids.max EROFS\noom_control True\nwritable mounts []\n"
				got := res.Stdout
				if who == "sandbox-user" {
					// Not the sandbox user's: which refusal comes first is the runtime's.
					got = strings.NewReplacer("controller EACCES", "controller EROFS", "pids.max EACCES", "pids.max EROFS").Replace(got)
				}
				if got != want {
					t.Fatalf("writes to /sys/fs/cgroup as %s on %s:\n%s\nwant:\n%s", who, rt, res.Stdout, want)
				}
			})
		}
	}
}
