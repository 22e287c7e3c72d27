//go:build !linux

package docker

import "errors"

// killTree needs the engine's processes visible in /proc; off Linux the engine runs in a
// VM and the command is left to the sandbox's lifetime.
func killTree(pid int) error {
	return errors.New("killing a command's process tree needs a Linux host")
}
