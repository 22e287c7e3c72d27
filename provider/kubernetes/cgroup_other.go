//go:build !linux

package kubernetes

// localCgroupV2: off Linux the provider's machine is no node; the nodes are taken to
// have today's default, the unified hierarchy, unless WithNodeCgroup says otherwise.
func localCgroupV2() bool { return true }
