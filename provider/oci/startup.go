package oci

import (
	"context"
	"errors"
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
