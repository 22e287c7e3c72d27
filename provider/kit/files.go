package kit

import (
	"fmt"

	"github.com/roche-sandbox/roche"
)

// ListDepth is the depth a roche.DirWalker lists to: 0 means 1, and a depth outside 1 to
// roche.MaxListDepth is refused.
func ListDepth(depth int) (int, error) {
	switch {
	case depth == 0:
		return 1, nil
	case depth < 0 || depth > roche.MaxListDepth:
		return 0, fmt.Errorf("%w: depth %d: give 1 (the directory's entries) to %d", roche.ErrInvalidConfig, depth, roche.MaxListDepth)
	}
	return depth, nil
}
