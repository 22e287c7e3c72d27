package docker

import (
	"context"
	"errors"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/roche-sandbox/roche/provider/internal/engine"
)

// A create cut short (its deadline passed, or its caller was interrupted) may leave a
// container: made, not yet started, or made by the engine after Create gave up, once a
// frozen engine resumes. These remove it without holding the caller up for long.
const (
	// undoTimeout bounds removing a half-made sandbox while the caller waits, when the
	// engine answers; after a cancellation the caller is on its way out, so it waits
	// less (undoCancelledTimeout).
	undoTimeout          = 10 * time.Second
	undoCancelledTimeout = time.Second
	// halfMadeRetry is how often, and halfMadeWindow how long, a half-made container is
	// looked for in the background; halfMadeGone is how many "no such container" answers
	// in a row, halfMadeRetry apart, show that the engine will not make it after all.
	halfMadeRetry  = 2 * time.Second
	halfMadeWindow = 10 * time.Minute
	halfMadeGone   = 3
)

// undo removes what a create made of a sandbox (ref is the container's id or name, dir
// its socket directory). why is what cut the create short, nil when the engine answered
// with an error: when the engine is not answering, waiting for it is pointless, so the
// removal goes to the background at once; otherwise it is tried now, briefly after a
// cancellation, and goes to the background only if it fails.
func (p *Provider) undo(ref, dir string, why error) {
	var notAnswering *engine.NotAnsweringError
	if !errors.As(why, &notAnswering) {
		timeout := undoTimeout
		if why != nil {
			timeout = undoCancelledTimeout
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := p.cli.ContainerRemove(ctx, ref, container.RemoveOptions{Force: true, RemoveVolumes: true})
		cancel()
		// A container that was never made is not proof: a request cut short may still be
		// on its way to the engine. One that was removed, or that the engine is removing
		// already (auto-remove), is done.
		if err == nil || isRemovalInProgress(err) {
			p.forget(ref)
			p.removeAgentDir(dir)
			return
		}
		p.log.Warn("removing a half-made sandbox: will retry in the background", "sandbox", ref, "err", err)
	}
	p.removeLater(ref, dir)
}

// removeLater removes a half-made container in the background, until it is removed, the
// engine says several times that it does not exist, halfMadeWindow passes, or the
// provider is closed. A process that exits first leaves it for roche gc, which removes
// containers left in the "created" state.
func (p *Provider) removeLater(ref, dir string) {
	p.halfMade.Add(1)
	go func() {
		defer p.halfMade.Done()
		defer p.removeAgentDir(dir)
		deadline := time.Now().Add(halfMadeWindow)
		missing := 0
		for time.Now().Before(deadline) {
			ctx, cancel := context.WithTimeout(p.closing, engine.ControlTimeout)
			err := p.cli.ContainerRemove(ctx, ref, container.RemoveOptions{Force: true, RemoveVolumes: true})
			cancel()
			switch {
			case err == nil:
				p.forget(ref)
				p.log.Info("removed a sandbox a create left half-made", "sandbox", ref)
				return
			case cerrdefs.IsNotFound(err):
				if missing++; missing >= halfMadeGone {
					return
				}
			default:
				missing = 0
			}
			select {
			case <-p.closing.Done():
				p.log.Warn("a half-made sandbox may be left for roche gc: the provider was closed first", "sandbox", ref)
				return
			case <-time.After(halfMadeRetry):
			}
		}
	}()
}
