package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// outcome is what Needs did to a test: skipped or failed it (with its line), or neither.
type outcome struct{ skipped, failed string }

// recorder stands in for a test's T, recording a skip or a failure and ending the
// goroutine as the testing package does.
type recorder struct {
	testing.TB
	out *outcome
}

func (r recorder) Helper() {}
func (r recorder) Skip(args ...any) {
	r.out.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r recorder) Fatalf(format string, args ...any) {
	r.out.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// needs runs Needs with the tier given and reports what it did.
func needs(t *testing.T, tier string, n ...Need) outcome {
	t.Setenv(TierEnv, tier)
	var out outcome
	done := make(chan struct{})
	go func() {
		defer close(done)
		Needs(recorder{out: &out}, n...)
	}()
	<-done
	return out
}

// TestFastTierSkips: in the fast tier a test that needs anything skips, saying what, in
// one line, whatever this machine has.
func TestFastTierSkips(t *testing.T) {
	got := needs(t, TierFast, Docker, Root)
	if got.skipped != "fast tier: needs a Docker engine and roche/python:local, root" || got.failed != "" {
		t.Fatalf("fast tier: %+v, want a skip naming both needs", got)
	}
}

// TestFullTierNeverSkips: in the full tier (set by make test, or unset) Needs lets the
// test run; what it cannot see from here (an engine, the cluster) is the test's own
// set-up to fail on.
func TestFullTierNeverSkips(t *testing.T) {
	for _, tier := range []string{TierFull, ""} {
		if got := needs(t, tier, Docker, Cluster, PythonWasm); got != (outcome{}) {
			t.Errorf("tier %q: %+v, want the test to go on", tier, got)
		}
	}
}

// TestFullTierFailsOnWhatIsMissing: in the full tier a need this machine visibly lacks
// (a tool not on PATH) fails the test in one line saying what to do; it never skips.
func TestFullTierFailsOnWhatIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	got := needs(t, TierFull, Tmux)
	if got.skipped != "" || !strings.HasPrefix(got.failed, "needs tmux, which this machine lacks: make test") || strings.Contains(got.failed, "\n") {
		t.Fatalf("full tier, no tmux on PATH: %+v, want a one-line failure", got)
	}
}
