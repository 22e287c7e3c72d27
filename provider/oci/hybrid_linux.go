package oci

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// unifiedMount is where a hybrid host (cgroup v1 controllers, plus a cgroup2 hierarchy
// beside them) mounts its cgroup2 hierarchy.
const unifiedMount = "/sys/fs/cgroup/unified"

// hybridCgroups reports whether the host mounts cgroups in hybrid mode: v1 controllers
// under a tmpfs at /sys/fs/cgroup and a cgroup2 hierarchy at /sys/fs/cgroup/unified.
func hybridCgroups() bool {
	var root, unified unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &root) != nil || unix.Statfs(unifiedMount, &unified) != nil {
		return false
	}
	return root.Type == unix.TMPFS_MAGIC && unified.Type == unix.CGROUP2_SUPER_MAGIC
}

// cgroupControllers are the v1 hierarchies mounted below /sys/fs/cgroup, as paths; none
// where /sys/fs/cgroup is not a tmpfs holding them (a cgroup v2 host).
func cgroupControllers() []string {
	var root unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &root) != nil || root.Type != unix.TMPFS_MAGIC {
		return nil
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		// Directories, and links such as cpu -> cpu,cpuacct.
		if e.IsDir() || e.Type()&os.ModeSymlink != 0 {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return out
}

// startWithoutUnified starts cmd in a mount namespace of its own in which the cgroup2
// hierarchy of a hybrid host is not mounted. crun refuses hybrid hosts outright ("cgroups
// in hybrid mode not supported") even though everything it limits (memory, pids, cpu)
// is a v1 controller there; without the cgroup2 mount it sees a cgroup v1 host and
// manages those controllers as runc does. The namespace is made on a thread of its own,
// which ends with the goroutine (it is never unlocked), so no other goroutine runs in it;
// the child forked from that thread inherits it. The host's mounts are made slaves of
// the host's there first, so that the unmount stays in the new namespace.
func startWithoutUnified(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	onOwnThread(func() {
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("a mount namespace for the OCI runtime: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
			errc <- fmt.Errorf("a mount namespace for the OCI runtime: making its mounts slaves: %w", err)
			return
		}
		if err := unix.Unmount(unifiedMount, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errc <- fmt.Errorf("a mount namespace for the OCI runtime: hiding %s: %w", unifiedMount, err)
			return
		}
		errc <- cmd.Start()
	})
	return <-errc
}

// onOwnThread runs f on an OS thread that ends with it, and waits for it. That thread is
// never the process's first one: /proc/self shows the first thread's mount namespace
// (and the runtime keeps that thread, parked, rather than ending it), so a namespace
// made there would be what every reader of /proc/self/mountinfo sees. A goroutine that
// lands on the first thread keeps it, so that the next one cannot, and tries again.
func onOwnThread(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			onOwnThread(f)
			runtime.UnlockOSThread()
			return
		}
		f() // the thread is not unlocked: it ends with this goroutine
	}()
	<-done
}

// sealBinary returns a sealed in-memory copy (a memfd with every write sealed off) of
// the runtime binary at path, to run in its place. Both runc and crun protect the host
// binary from a container that would overwrite it through /proc/PID/exe
// (CVE-2019-5736) by copying themselves into such a memfd, or a read-only bind mount,
// and running that copy, at every create: a second exec and dynamic link, two mounts,
// about a third of crun's time here. Started from a copy already sealed so, they see
// themselves as that copy and skip it; the protection is the same, paid once per
// process.
func sealBinary(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	fd, err := unix.MemfdCreate(filepath.Base(path), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("a sealed copy of %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+filepath.Base(path))
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("a sealed copy of %s: %w", path, err)
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("sealing the copy of %s: %w", path, err)
	}
	return f, nil
}
