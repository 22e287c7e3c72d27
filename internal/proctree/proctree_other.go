//go:build !linux

package proctree

import (
	"errors"
	"fmt"
)

// KillTree needs /proc; off Linux (where an engine runs in a VM) it cannot reach the
// processes, and a command is left to its sandbox's lifetime.
func KillTree(pid int) error {
	return errors.New("killing a command's process tree needs a Linux host")
}

// Leftover is 0 where there is no /proc to count in.
func Leftover(int) int { return 0 }

// EachMember finds no process where there is no /proc to walk.
func EachMember(int, func(int)) {}

// StartTime is unknown where there is no /proc to read.
func StartTime(pid int) (uint64, error) {
	return 0, fmt.Errorf("no start time of process %d: no /proc here", pid)
}
