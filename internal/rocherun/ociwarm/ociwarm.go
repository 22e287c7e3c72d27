// Package ociwarm begins, as roche-run initialises, the kernel's grace period that the
// oci provider's create would begin itself (cgroupwarm.For), when roche-run is given a
// one-shot oci run that it makes itself, not roched: imported by cmd/roche-run alone,
// for that side effect. Its imports are few and initialised early (cmd/roche-run's
// TestWarmsFirst), so it runs ~1.5 ms into the process rather than ~6 to 8 ms (after
// the command line and the provider's opening), and the grace period (~10 ms here) has
// passed, or nearly, when crun makes the sandbox's first cgroup, which waits for it
// (see cgroupwarm.Start).
package ociwarm

import (
	"os"
	"time"

	"github.com/roche-sandbox/roche/internal/cgroupwarm"
	"github.com/roche-sandbox/roche/internal/rocherun"
)

// window is how long the early start keeps the way open by itself: past the create's
// own start on a loaded machine, which then keeps it open as long as it needs. An
// image's first unpack outlasts it, and the warm-up's moves stop until the create's
// own start, once the image is ready.
const window = 250 * time.Millisecond

func init() {
	if len(os.Args) > 1 && warms(os.Args[1:], os.Getenv, os.Geteuid()) {
		cgroupwarm.For(window)
	}
}

// warms is whether roche-run, given args (without the program name), the environment
// getenv reads and effective uid euid, makes a one-shot oci sandbox in its own process,
// so that its create's warm-up is worth beginning now: an oci run with no roched to
// hand it to (rocherun.InProcess), as root (the oci provider is, and the warm-up writes
// to cgroupfs).
func warms(args []string, getenv func(string) string, euid int) bool {
	return euid == 0 && rocherun.InProcess(args, getenv) == "oci"
}
