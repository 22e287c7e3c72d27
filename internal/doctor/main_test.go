package doctor_test

import (
	"os"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestMain builds roche-agent, which every provider but wasm checks for.
func TestMain(m *testing.M) { os.Exit(testenv.RunWithAgent(m)) }
