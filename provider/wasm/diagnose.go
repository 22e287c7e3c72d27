package wasm

import (
	"context"

	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Diagnoser = (*Provider)(nil)

// Diagnose implements kit.Diagnoser: python.wasm present where the provider looks (its
// Available). The image is not the wasm provider's to choose: it runs python.wasm.
func (p *Provider) Diagnose(_ context.Context, _ string) []kit.Finding {
	path, _ := p.PythonPath()
	return []kit.Finding{kit.Found("python.wasm", p.checkPython(), path)}
}
