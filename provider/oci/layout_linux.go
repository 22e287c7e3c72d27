package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// openLayout opens a layout's directory as an os.Root. With pinned layouts every
// component of dir is opened in turn without following a link, refusing any: roched
// checked the path as a string, and a link swapped in since (by a sandbox with a
// writable mount above it) must lead nowhere. Otherwise dir's links are followed, as
// the caller's own.
func (p *Provider) openLayout(dir string) (*os.Root, error) {
	if !filepath.IsAbs(dir) {
		return nil, errors.New("not an absolute path")
	}
	if !p.pinLayouts {
		return os.OpenRoot(dir)
	}
	if filepath.Clean(dir) != dir {
		return nil, errors.New("give the path without . or .. components")
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	for _, c := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if c == "" {
			continue
		}
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%s is a symbolic link or not a directory: give the layout's path without links", c)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c, err)
		}
		fd = next
	}
	defer unix.Close(fd)
	// The descriptor's own directory, whatever its path names by now.
	return os.OpenRoot("/proc/self/fd/" + strconv.Itoa(fd))
}
