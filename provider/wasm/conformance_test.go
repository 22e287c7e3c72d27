package wasm

import (
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestConformance runs the suite every provider runs, against the real python.wasm.
func TestConformance(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	providertest.Run(t, tp, providertest.Options{Config: roche.DefaultConfig()})
}

// TestConformanceWarm runs the suite with warm start on, as roched runs the provider:
// execs that follow a create by more than a moment run on the interpreter started for
// them, and must pass the same checks.
func TestConformanceWarm(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	before := twp.WarmStats().Served
	providertest.Run(t, twp, providertest.Options{Config: roche.DefaultConfig()})
	t.Logf("%d of the suite's execs ran on a warm interpreter", twp.WarmStats().Served-before)
	if twp.WarmStats().Served == before {
		t.Fatal("no exec of the suite ran on a warm interpreter")
	}
}
