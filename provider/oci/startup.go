package oci

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
)

// runtimeAndImage resolves the runtime and looks the image up at the same time. In a
// process that makes one sandbox (roche run with no roched) neither is known yet: the
// runtime's resolution reads its probe verdict and compiled seccomp filter and seals a
// copy of its binary, and the image's lookup asks the Docker engine (a version
// negotiation and an inspect, the engine's round trips), each a few milliseconds of a
// one-shot run's critical path, which run side by side instead of one after the other.
// In a process that made one before (roched), the runtime is resolved already and this
// is the lookup alone. Neither depends on the other. A runtime that fails cancels the
// lookup (which may be unpacking the image) and its error is returned; a lookup that
// fails lets the resolution finish (an interrupted probe would have to run again in the
// next process) and its error is returned.
func (p *Provider) runtimeAndImage(ctx context.Context, ref string) (*ociRuntime, imageRoot, error) {
	p.rtMu.Lock()
	rt := p.rt
	p.rtMu.Unlock()
	if rt != nil {
		img, err := p.image(ctx, ref)
		return rt, img, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type looked struct {
		img imageRoot
		err error
	}
	done := make(chan looked, 1)
	go func() {
		img, err := p.image(ctx, ref)
		done <- looked{img, err}
	}()
	rt, rtErr := p.resolveRuntime(ctx)
	if rtErr != nil {
		cancel()
	}
	l := <-done
	if rtErr != nil {
		if l.err != nil && !errors.Is(l.err, context.Canceled) {
			p.log.Debug("looking up the image, beside a runtime that failed", "image", ref, "err", l.err)
		}
		return nil, imageRoot{}, rtErr
	}
	if l.err != nil {
		return nil, imageRoot{}, l.err
	}
	return rt, l.img, nil
}

// errImageMoved is a create's when the image it guessed (guessImage) is not the one the
// engine now names by that reference: the create is undone and made again.
var errImageMoved = errors.New("the image's name now names another image")

// runtimeAndGuess is runtimeAndImage for a create that need not wait for the engine:
// when a create in an earlier process unpacked an image under ref (knownRef) and this
// process has not asked the engine about ref lately (recentID), it returns that image at
// once with confirm, which waits for the engine's answer, asked meanwhile, and fails
// with errImageMoved when ref now names another image (or with the lookup's error). The
// create goes ahead beside the engine's round trips (1 to 20 ms here, seconds on a busy
// engine), and calls confirm before any command can run in the sandbox: once its agent
// is up, so that a name that moved since is honoured as before. Otherwise confirm is nil
// and this is runtimeAndImage. stop ends the lookup, if it still runs, when the create
// is done with it.
func (p *Provider) runtimeAndGuess(ctx context.Context, ref string) (rt *ociRuntime, img imageRoot, confirm func(context.Context) error, stop func(), err error) {
	guess, ok := p.guessImage(ref)
	if !ok {
		rt, img, err = p.runtimeAndImage(ctx, ref)
		return rt, img, nil, func() {}, err
	}
	lctx, cancel := context.WithCancel(ctx)
	type looked struct {
		id  string
		err error
	}
	done := make(chan looked, 1)
	go func() {
		id, err := p.recentID(lctx, ref)
		done <- looked{id, err}
	}()
	rt, err = p.resolveRuntime(ctx)
	if err != nil {
		cancel()
		<-done
		return nil, imageRoot{}, nil, func() {}, err
	}
	var l *looked
	confirm = func(ctx context.Context) error {
		if l == nil {
			select {
			case got := <-done:
				l = &got
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		switch {
		case l.err != nil && errors.Is(l.err, roche.ErrUnavailable):
			// As image does: the image unpacked before under this name.
			p.log.Warn("the Docker engine does not answer; using the image unpacked before under this name", "image", ref, "err", l.err)
		case l.err != nil:
			return l.err
		case l.id != guess.ID:
			return errImageMoved
		}
		return nil
	}
	return rt, guess, confirm, cancel, nil
}

// guessImage is the image an earlier create unpacked under the Docker reference ref,
// when this process has not looked ref up within refTTL.
func (p *Provider) guessImage(ref string) (imageRoot, bool) {
	if strings.HasPrefix(ref, LayoutPrefix) {
		return imageRoot{}, false
	}
	p.refsMu.Lock()
	r, fresh := p.refs[ref]
	p.refsMu.Unlock()
	if fresh && time.Since(r.at) < refTTL {
		return imageRoot{}, false
	}
	return p.knownRef(ref)
}
