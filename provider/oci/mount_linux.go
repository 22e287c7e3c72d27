package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/flock"
)

// mountOverlay mounts the sandbox's root at target: an overlay whose lower layers are the
// stubs directory (the mount points the image lacks) over the image's unpacked tree,
// read-only, with upper and work directories only for a writable root.
func mountOverlay(target, stubs, image, upper, work string) error {
	opts := "lowerdir=" + stubs + ":" + image
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	}
	// A read-only overlay also refuses writes below the sandbox's own root remount.
	flags := uintptr(unix.MS_NODEV)
	if upper == "" {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mounting the sandbox's root (overlay %s): %w", opts, err)
	}
	return nil
}

// unmountAll unmounts dir if it is mounted (detaching it when busy); one not mounted, or
// missing, is not an error.
func unmountAll(dir string) error {
	for range 8 {
		err := unix.Unmount(dir, 0)
		switch {
		case err == nil:
			continue // stacked mounts: go again
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmounting %s: %w", dir, err)
			}
			return nil
		default:
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
	}
	return nil
}

// exitWaiter opens a pidfd on pid and returns what waits, at most d, for that process to
// exit (reporting whether it did) and closes the pidfd; ok is false when there is no such
// process (or no pidfds).
func exitWaiter(pid int) (wait func(d time.Duration) bool, ok bool) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, false
	}
	return func(d time.Duration) bool {
		defer unix.Close(fd)
		if d <= 0 {
			return false
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		deadline := time.Now().Add(d)
		for {
			left := time.Until(deadline)
			if left <= 0 {
				return false
			}
			n, err := unix.Poll(fds, int(left.Milliseconds())+1)
			if err == nil && n > 0 {
				return true
			}
			if err != nil && !errors.Is(err, unix.EINTR) {
				return false
			}
		}
	}, true
}

// lockPath takes an exclusive lock on path (a directory or file that exists), waiting
// with ctx; the returned func releases it.
func lockPath(ctx context.Context, path string) (func(), error) { return flock.Lock(ctx, path) }

// mountsBelow lists the mount points at or below any of dirs, deepest first (from
// /proc/self/mountinfo, read once for all of them: with many sandboxes it runs to
// hundreds of lines, and every destroy reads it).
func mountsBelow(dirs ...string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line) // ID PARENT MAJ:MIN ROOT MOUNTPOINT ...
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		for _, dir := range dirs {
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
				break
			}
		}
	}
	slices.Reverse(out)
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space and the like).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
