package kubernetes

import (
	"context"

	"github.com/roche-sandbox/roche"
)

// CopyTo implements roche.FileCopier with the default options (see roche.CopyIn): the
// archive streams to the agent, which unpacks it as the sandbox user.
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyIn(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyFrom implements roche.FileCopier with the default options (see roche.CopyOut).
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyOut(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}
