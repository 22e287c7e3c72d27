package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// cgroupRoot is where the cgroup hierarchies are mounted (a variable for tests).
var cgroupRoot = "/sys/fs/cgroup"

// hostKernel is the kernel, cgroup and user-namespace findings.
func hostKernel() []kit.Finding {
	var out []kit.Finding
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		out = append(out, kit.Found("kernel", nil, "Linux "+unix.ByteSliceToString(u.Release[:])))
	}
	out = append(out, cgroups(cgroupRoot)...)
	return append(out, userNamespaces(readTrim))
}

// cgroups is the cgroup version found at root and, what the providers' memory, pids and
// CPU limits need, those controllers delegated: enabled for child groups on v2 (in the
// root's cgroup.subtree_control), mounted on v1.
func cgroups(root string) []kit.Finding {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return []kit.Finding{kit.Found("cgroup", fmt.Errorf("%w: %s: %v", roche.ErrUnavailable, root, err), "")}
	}
	want := []string{"cpu", "memory", "pids"}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		version := kit.Found("cgroup", nil, "v2 (unified) at "+root)
		ctl, err := readTrim(filepath.Join(root, "cgroup.subtree_control"))
		if err != nil {
			return []kit.Finding{version, kit.Found("cgroup delegation", fmt.Errorf("%w: %v", roche.ErrUnavailable, err), "")}
		}
		have := strings.Fields(ctl)
		var missing []string
		for _, c := range want {
			if !slices.Contains(have, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return []kit.Finding{version, kit.Lacks("cgroup delegation",
				fmt.Errorf("%w: the %s controller(s) are not enabled for child cgroups in %s/cgroup.subtree_control (%q), and sandbox limits need them", roche.ErrUnavailable, strings.Join(missing, ", "), root, ctl),
				"echo '+"+strings.Join(missing, " +")+"' > "+root+"/cgroup.subtree_control", true)}
		}
		return []kit.Finding{version, kit.Found("cgroup delegation", nil, "cpu, memory and pids enabled for child cgroups")}
	}
	mode := "v1"
	if err := unix.Statfs(filepath.Join(root, "unified"), &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		mode = "v1, hybrid (v2 at " + root + "/unified, with no controllers: crun runs with it hidden)"
	}
	version := kit.Found("cgroup", nil, mode)
	var missing []string
	for _, c := range want {
		if _, err := os.Stat(filepath.Join(root, c)); err != nil {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return []kit.Finding{version, kit.Lacks("cgroup delegation",
			fmt.Errorf("%w: the %s controller(s) have no hierarchy under %s, and sandbox limits need them", roche.ErrUnavailable, strings.Join(missing, ", "), root),
			"mount -t cgroup -o "+missing[0]+" cgroup "+root+"/"+missing[0], true)}
	}
	return []kit.Finding{version, kit.Found("cgroup delegation", nil, "cpu, memory and pids each mounted (v1)")}
}

// userNamespaces is the user-namespace finding from the two sysctls that bound them
// (the second Debian's own): optional, as the providers run as root.
func userNamespaces(read func(string) (string, error)) kit.Finding {
	var f kit.Finding
	max, err := read("/proc/sys/user/max_user_namespaces")
	n, _ := strconv.Atoi(max)
	clone, cerr := read("/proc/sys/kernel/unprivileged_userns_clone")
	switch {
	case err != nil:
		f = kit.Found("user namespaces", fmt.Errorf("%w: reading user.max_user_namespaces: %v", roche.ErrUnsupported, err), "")
	case n == 0:
		f = kit.Lacks("user namespaces", fmt.Errorf("%w: user namespaces are off (user.max_user_namespaces = 0)", roche.ErrUnavailable),
			"sysctl -w user.max_user_namespaces=15000", true)
	case cerr == nil && clone == "0":
		f = kit.Lacks("user namespaces", fmt.Errorf("%w: unprivileged user namespaces are off (kernel.unprivileged_userns_clone = 0)", roche.ErrUnavailable),
			"sysctl -w kernel.unprivileged_userns_clone=1", true)
	default:
		f = kit.Found("user namespaces", nil, fmt.Sprintf("on (at most %d)", n))
	}
	f.Optional = true
	return f
}

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}
