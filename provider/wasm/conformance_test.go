package wasm

import (
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// TestConformance runs the suite every provider runs, against the real python.wasm.
func TestConformance(t *testing.T) {
	providertest.Run(t, tp, providertest.Options{Config: roche.DefaultConfig()})
}
