//go:build unix && !linux

package tarfs

import (
	"errors"

	"golang.org/x/sys/unix"
)

// chmodNoFollow sets the mode of name in dirfd without following it should it be a
// symlink (lchmod).
func chmodNoFollow(dirfd int, name string, mode uint32) error {
	return unix.Fchmodat(dirfd, name, mode, unix.AT_SYMLINK_NOFOLLOW)
}

// mknodAt: root filesystems with devices are made on Linux only (microVMs).
func mknodAt(dirfd int, name string, mode uint32, dev uint64) error {
	return errors.ErrUnsupported
}

// setTime sets the access and modification times of the open file fd.
func setTime(fd int, t unix.Timespec) error {
	tv := unix.NsecToTimeval(unix.TimespecToNsec(t))
	return unix.Futimes(fd, []unix.Timeval{tv, tv})
}
