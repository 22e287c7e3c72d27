//go:build !linux

package server

import "errors"

// IsVMInit is false off Linux: a microVM's init is a Linux process.
func IsVMInit() bool { return false }

// RunVM is never reached off Linux.
func RunVM() error { return errors.New("roche-agent runs on Linux only") }
