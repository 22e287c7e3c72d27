// Package faults holds Roche's fault-injection tests, run against the real engine: an
// engine socket that accepts and never answers, a proxy in front of the real engine
// that withholds chosen answers (the engine does the work, the caller never hears) or
// every answer, dockerd itself frozen with SIGSTOP for a few seconds, a dockerd of the
// test's own stopped and started again under a roched with a pool, signals sent to
// roche while it waits, an agent that cannot start, roched gone or killed outright
// (mid-refill too, under commands, and during oci creates), its state file lost or
// cut short, an oci sandbox's agent that exits, a provider skipped by a list, roched's
// memory under concurrent large outputs, a held sandbox destroyed under its holder, and
// roche run killed with a microVM. Each test asserts the bound (a deadline with margin, not a timing
// benchmark), the one-line error, and that nothing was left behind. The package has no
// code of its own.
package faults
