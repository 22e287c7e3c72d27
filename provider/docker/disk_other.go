//go:build !linux

package docker

import (
	"errors"
)

// Sized filesystems need Linux (loop devices, mount); elsewhere writable roots with a
// disk limit and workspaces are refused.

var errNoSizedFS = errors.New("sized disks need a Linux host")

func isMountPoint(string) (bool, error)           { return false, nil }
func sizeLayerDir(string, int64) error            { return errNoSizedFS }
func sameFilesystem(string, string) (bool, error) { return false, errNoSizedFS }
func lockFile(string) (func(), error)             { return nil, errNoSizedFS }

func goferPid(int, string) (int, error) { return 0, errors.ErrUnsupported }
