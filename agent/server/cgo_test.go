//go:build cgo

package server_test

// The agent is a static binary built with CGO_ENABLED=0; with cgo, the runtime cannot
// apply a system call to every thread (syscall.AllThreadsSyscall), which the agent needs
// to drop the capability bounding set, so the tests would test another program.
const cgoEnabled = true
