//go:build unix

package cli

import "syscall"

// detached starts roched in a session of its own, so that the terminal's Ctrl-C and
// hang-up do not reach it once roche daemon start has returned.
func detached() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// processAlive reports whether pid still exists.
func processAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }
