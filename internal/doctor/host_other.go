//go:build !linux

package doctor

import (
	"fmt"
	"runtime"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// hostKernel says that the providers but wasm need Linux.
func hostKernel() []kit.Finding {
	return []kit.Finding{kit.Found("kernel", fmt.Errorf("%w: %s: every provider but wasm runs on Linux", roche.ErrUnsupported, runtime.GOOS), "")}
}
