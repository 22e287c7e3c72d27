package oci

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// unrecordedDir makes, in the state directory, what a create killed before its record
// leaves: the sandbox's directory, marked with when its create gave up (by).
func unrecordedDir(t *testing.T, state string, by time.Time) string {
	t.Helper()
	dir := filepath.Join(state, Name+"-"+randomHex(8))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	markStartBy(dir, by)
	return dir
}

// TestGCSweepsUnrecordedWhenListFails: the directories of creates killed before their
// record go at a GC even when its List fails (here on a record naming a runtime that is
// not installed); List needs the runtime, the sweep does not.
func TestGCSweepsUnrecordedWhenListFails(t *testing.T) {
	state := t.TempDir()
	p, err := New(WithStateDir(state), WithDataDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(state, Name+"-"+randomHex(8))
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := writeRecord(other, record{ID: filepath.Base(other), Runtime: "no-such-oci-runtime", UID: -1}); err != nil {
		t.Fatal(err)
	}
	due := unrecordedDir(t, state, time.Now().Add(-time.Second))
	notYet := unrecordedDir(t, state, time.Now().Add(time.Hour))

	if _, err := p.GC(context.Background(), roche.GCOptions{DryRun: true}); err == nil {
		t.Fatal("GC listed a sandbox whose runtime is not installed without an error")
	}
	if _, err := os.Stat(due); err != nil {
		t.Fatalf("a dry run removed %s: %v", due, err)
	}
	if _, err := p.GC(context.Background(), roche.GCOptions{}); err == nil {
		t.Fatal("GC listed a sandbox whose runtime is not installed without an error")
	}
	if _, err := os.Stat(due); !os.IsNotExist(err) {
		t.Errorf("%s, whose create gave up, is still there after a GC whose List failed: %v", due, err)
	}
	for _, d := range []string{notYet, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
}

// TestSweepSoonRefusedKeepsItsTurn: a process whose sweep another process's recent one
// put off sweeps at its next create, not a minute later; what fell due in between goes
// then.
func TestSweepSoonRefusedKeepsItsTurn(t *testing.T) {
	state := t.TempDir()
	p, err := New(WithStateDir(state), WithDataDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if !p.claimSweep(sweepShared) { // another process's sweep, just now
		t.Fatal("the first claim of an empty state directory was refused")
	}
	due := unrecordedDir(t, state, time.Now().Add(-time.Second))
	p.sweepSoon()
	p.sweeps.Wait()
	if _, err := os.Stat(due); err != nil {
		t.Fatalf("swept within %v of another process's sweep: %v", sweepShared, err)
	}
	if last := p.lastSweep.Load(); last != 0 {
		t.Fatalf("a refused sweep used up the process's minute (last sweep %v)", time.Unix(0, last))
	}
	// The other process's sweep is sweepShared old at the next create.
	old := time.Now().Add(-sweepShared - time.Second)
	if err := os.Chtimes(filepath.Join(state, sweepStamp), old, old); err != nil {
		t.Fatal(err)
	}
	p.sweepSoon()
	p.sweeps.Wait()
	if _, err := os.Stat(due); !os.IsNotExist(err) {
		t.Errorf("%s, whose create gave up, is still there after the next create's sweep: %v", due, err)
	}
}
