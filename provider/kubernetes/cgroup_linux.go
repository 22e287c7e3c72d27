package kubernetes

import "golang.org/x/sys/unix"

// localCgroupV2 reports whether this machine has the unified cgroup hierarchy
// (/sys/fs/cgroup a cgroup2 file system), taken for the nodes' unless WithNodeCgroup
// says otherwise: in the cluster, the provider's machine is a node.
func localCgroupV2() bool {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return true // today's default
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC
}
