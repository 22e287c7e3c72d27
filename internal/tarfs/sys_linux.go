package tarfs

import (
	"errors"
	"strconv"

	"golang.org/x/sys/unix"
)

// chmodNoFollow sets the mode of name in dirfd without following it should it be a
// symlink: with fchmodat2 (Linux 6.6), or else through an O_PATH descriptor of what
// name is, changed by its /proc/self/fd link (which names that file itself), as glibc
// does.
func chmodNoFollow(dirfd int, name string, mode uint32) error {
	err := unix.Fchmodat(dirfd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.EOPNOTSUPP // a link's own mode means nothing on Linux
	}
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode)
}

// mknodAt makes the device or fifo name in dirfd.
func mknodAt(dirfd int, name string, mode uint32, dev uint64) error {
	return unix.Mknodat(dirfd, name, mode, int(dev))
}

// setTime sets the access and modification times of the open file fd.
func setTime(fd int, t unix.Timespec) error {
	return unix.UtimesNanoAt(fd, "", []unix.Timespec{t, t}, unix.AT_EMPTY_PATH)
}
