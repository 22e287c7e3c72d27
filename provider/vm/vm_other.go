//go:build !linux

package vm

import (
	"context"
	"fmt"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Provider is the microVM backend; off Linux it only reports that it is unavailable.
type Provider struct {
	options
	name string
}

// NewQEMU returns the "qemu" provider.
func NewQEMU(opts ...Option) (*Provider, error) { return &Provider{name: QEMU}, nil }

// NewFirecracker returns the "firecracker" provider.
func NewFirecracker(opts ...Option) (*Provider, error) { return &Provider{name: Firecracker}, nil }

func (p *Provider) unavailable() error {
	return fmt.Errorf("%w: the %s provider runs microVMs on Linux with KVM (or QEMU's emulation) only", roche.ErrUnavailable, p.name)
}

// Available reports that microVMs need Linux.
func (p *Provider) Available() error { return p.unavailable() }

// Diagnose implements kit.Diagnoser: microVMs need Linux.
func (p *Provider) Diagnose(context.Context, string) []kit.Finding {
	return []kit.Finding{kit.Found("hypervisor", p.unavailable(), "")}
}

// Acceleration reports that microVMs need Linux.
func (p *Provider) Acceleration(context.Context) (string, string, error) {
	return "", "", p.unavailable()
}

// Close does nothing.
func (p *Provider) Close() error { return nil }

// Name implements roche.Provider.
func (p *Provider) Name() string { return p.name }

// Capabilities implements roche.Provider.
func (p *Provider) Capabilities() roche.Capabilities { return roche.Capabilities{} }

// Create implements roche.Provider.
func (p *Provider) Create(context.Context, roche.Config) (roche.SandboxInfo, error) {
	return roche.SandboxInfo{}, p.unavailable()
}

// CreateFor implements kit.Creator.
func (p *Provider) CreateFor(context.Context, roche.Config, kit.CreateOptions) (roche.SandboxInfo, error) {
	return roche.SandboxInfo{}, p.unavailable()
}

// Exec implements roche.Provider.
func (p *Provider) Exec(context.Context, string, roche.ExecRequest) (roche.ExecResult, error) {
	return roche.ExecResult{}, p.unavailable()
}

// Destroy implements roche.Provider.
func (p *Provider) Destroy(context.Context, string) error { return nil }

// Inspect implements roche.Provider.
func (p *Provider) Inspect(_ context.Context, id string) (roche.SandboxInfo, error) {
	return roche.SandboxInfo{}, fmt.Errorf("%w: no %s sandbox %s", roche.ErrNotFound, p.name, id)
}

// List implements roche.Provider.
func (p *Provider) List(context.Context) ([]roche.SandboxInfo, error) {
	return []roche.SandboxInfo{}, nil
}

var (
	_ roche.Provider = (*Provider)(nil)
	_ kit.Creator    = (*Provider)(nil)
)

// PauseToDisk implements roche.MemorySnapshotter: unavailable off Linux.
func (p *Provider) PauseToDisk(context.Context, string) error { return p.unavailable() }

// Resume implements roche.MemorySnapshotter: unavailable off Linux.
func (p *Provider) Resume(context.Context, string) (roche.SandboxInfo, error) {
	return roche.SandboxInfo{}, p.unavailable()
}

// Fork implements roche.MemorySnapshotter: unavailable off Linux.
func (p *Provider) Fork(context.Context, string, int) ([]roche.SandboxInfo, error) {
	return nil, p.unavailable()
}
