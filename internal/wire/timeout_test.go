package wire_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/wire"
)

// TestExecTimeout: seconds convert without overflowing, and what cannot be a timeout is
// refused before the conversion (9999999999 s once wrapped to a timeout that had passed).
func TestExecTimeout(t *testing.T) {
	if d, err := wire.ExecTimeout(1.5); err != nil || d != 1500*time.Millisecond {
		t.Fatalf("1.5: %v %v", d, err)
	}
	for _, bad := range []float64{-1, 9999999999, math.NaN(), math.Inf(1), math.Inf(-1), 2147483647} {
		if _, err := wire.ExecTimeout(bad); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "timeout_secs") {
			t.Errorf("wire.ExecTimeout(%v): %v", bad, err)
		}
	}
}
