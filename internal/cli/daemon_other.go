//go:build !unix

package cli

import "syscall"

// detached: no sessions to leave outside unix.
func detached() *syscall.SysProcAttr { return nil }

// processAlive cannot be told outside unix; the socket going quiet is the sign.
func processAlive(int) bool { return false }
