package wire

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/roche-sandbox/roche"
)

// ExecTimeout converts a command timeout given in seconds (the API's and the MCP tools'
// timeout_secs, the CLI's --timeout) to a roche.ExecRequest's Timeout, refusing what no
// ExecRequest accepts before the conversion to a Duration could overflow: negative,
// NaN, infinite or over roche.MaxExecTimeout.
func ExecTimeout(secs float64) (time.Duration, error) {
	switch {
	case secs < 0 || math.IsNaN(secs) || math.IsInf(secs, -1):
		return 0, fmt.Errorf("%w: timeout_secs %s: give seconds > 0, or 0 for the sandbox's lifetime", roche.ErrInvalidConfig, seconds(secs))
	case secs > roche.MaxExecTimeout.Seconds():
		return 0, fmt.Errorf("%w: timeout_secs %s is over the limit of %d (24 h)", roche.ErrInvalidConfig, seconds(secs), int(roche.MaxExecTimeout.Seconds()))
	}
	// Rounded, not truncated: a Duration sent as seconds (Duration.Seconds) comes back
	// as itself, where 247.013µs would otherwise come back 1 ns short.
	return time.Duration(math.Round(secs * float64(time.Second))), nil
}

// seconds renders a count of seconds as given, 9999999999 rather than 1e+10.
func seconds(s float64) string { return strconv.FormatFloat(s, 'f', -1, 64) }
