//go:build !linux

package oci

import "time"

// Elsewhere there are no oci sandboxes to watch (see mount_other.go).

func (p *Provider) watchExit(*sandbox) {}
func (p *Provider) stopExitWatches()   {}
func (p *Provider) unwatchExit(string) {}

func (p *Provider) sawOOMsBeforeTeardown(string) {}

func (p *Provider) killWatched(string) {}

func stopRunsOf(string) bool { return false }

func forgetHalfMade(string, string) error { return nil }

func removeCgroups(string) error { return nil }

func markStartBy(string, time.Time) {}

func (p *Provider) sweepUnrecorded() {}

func pidGone(int) bool { return false }
