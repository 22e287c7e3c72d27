//go:build !linux

package cgroupwarm

import "time"

// Start and For do nothing off Linux: a cgroup v1 host's grace period is Linux's.
func Start() (done func()) { return func() {} }

// For: see Start.
func For(time.Duration) {}
