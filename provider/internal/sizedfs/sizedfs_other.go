//go:build !linux

package sizedfs

import "errors"

// Sized filesystems need Linux (loop devices, mount); elsewhere writable roots with a
// disk limit and workspaces are refused.

// Kind says how a sized filesystem is made.
type Kind int

const (
	Layer Kind = iota
	Workspace
)

var errNoSizedFS = errors.New("sized disks need a Linux host")

func MountNew(string, string, int64) error { return errNoSizedFS }
func Make(string, int64, Kind) error       { return errNoSizedFS }
func Mount(string, string) error           { return errNoSizedFS }
func Unmount(string) (bool, error)         { return false, nil }
func CanMount() error                      { return errNoSizedFS }
func Available() error                     { return errNoSizedFS }
