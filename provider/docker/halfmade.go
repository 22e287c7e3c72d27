package docker

import (
	"context"
	"errors"
	"strconv"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

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
// its socket directory). made says the engine answered the create with ref, its id: then
// "no such container" means it is gone already (its auto-remove, when the agent exited
// at once, can finish first). A create cut short names it instead, and the container may
// yet be made. why is what cut the create short, nil when the engine answered with an
// error: when the engine is not answering, waiting for it is pointless, so the removal
// goes to the background at once; otherwise it is tried now, briefly after a
// cancellation, and goes to the background only if it fails.
func (p *Provider) undo(ref, dir string, made bool, why error) {
	var notAnswering *engine.NotAnsweringError
	if !errors.As(why, &notAnswering) {
		timeout := undoTimeout
		if why != nil {
			timeout = undoCancelledTimeout
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := p.cli.ContainerRemove(ctx, ref, removeOpts)
		// A container that was never made is not proof: a request cut short may still be
		// on its way to the engine. One that was removed is done, and so is one the
		// engine is removing already (auto-remove) once it is gone.
		if made && cerrdefs.IsNotFound(err) {
			err = nil
		}
		if isRemovalInProgress(err) {
			err = p.awaitRemoval(ctx, ref)
		}
		cancel()
		if err == nil {
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
			err := p.cli.ContainerRemove(ctx, ref, removeOpts)
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

// unstartedSweepEvery bounds how often a create looks for never-started leftovers;
// unstartedSlack is how long after its creator gave up one is left alone, for a creator
// that is still alive to remove it itself (removeLater).
const (
	unstartedSweepEvery = 30 * time.Second
	unstartedSlack      = 30 * time.Second
)

// sweepUnstartedSoon removes, in the background and at most once per
// unstartedSweepEvery, Roche containers still in the "created" state unstartedSlack
// after the create that made them gave up (LabelStartBy; without it, twice this
// provider's engine timeout after they were made). Roche starts a container as soon as
// it is made, so one left unstarted was made by a creator that died between the
// engine's create and its start (roche or roched killed outright, e.g. during a pool
// refill): nothing runs in it, so no lease covers it, and nothing else would ever start
// or remove it. The next create on the engine, by any process, does, once it has made its
// own sandbox; it also removes the agent directories of sandboxes gone (sweepAgentDirs).
func (p *Provider) sweepUnstartedSoon() {
	now := time.Now()
	last := p.lastSweep.Load()
	if now.UnixNano()-last < int64(unstartedSweepEvery) || !p.lastSweep.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	p.halfMade.Add(1)
	go func() {
		defer p.halfMade.Done()
		// Bound, so that the list waits for the API version to be agreed without taking
		// the client's lock (engine.Negotiation).
		ctx, done := p.bound(p.closing, "looking for sandboxes left never started")
		var err error
		defer done(&err)
		// Every Roche container: the never-started ones are among them, and the agent
		// directories of all of them are not leftovers.
		cs, err := p.containers(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
			filters.Arg("label", LabelManaged+"=true"),
		)})
		if err != nil {
			return // the next create looks again
		}
		for _, c := range cs {
			if c.State != container.StateCreated || c.Labels[LabelProvider] != "docker" {
				continue
			}
			giveUp := time.Unix(c.Created, 0).Add(2 * p.engineTimeout)
			if by, err := strconv.ParseInt(c.Labels[LabelStartBy], 10, 64); err == nil {
				giveUp = time.Unix(by, 0)
			}
			if time.Now().Before(giveUp.Add(unstartedSlack)) {
				continue
			}
			err = p.cli.ContainerRemove(ctx, c.ID, removeOpts)
			if err != nil && !cerrdefs.IsNotFound(err) {
				p.log.Warn("removing a sandbox its creator left never started", "sandbox", c.ID, "err", err)
				continue
			}
			p.forget(c.ID)
			p.removeAgentDir(c.Labels[LabelAgentDir])
			p.log.Info("removed a sandbox its creator left never started (it died between the engine's create and start)",
				"sandbox", c.ID, "owner", c.Labels[LabelOwner])
		}
		// And the socket directories of sandboxes that ended with no one of ours
		// watching: a sandbox whose creator was killed (its lease then ends it) or
		// that reached its lifetime while no roched ran; the engine removes such a
		// container and knows nothing of its directory.
		// (A never-started container removed above still counts as live here: its
		// directory is removed with it.)
		p.sweepAgentDirsOf(cs)
	}()
}
