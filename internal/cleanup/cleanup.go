// Package cleanup undoes partial work when a multi-step operation fails part way, in
// the shape of gVisor's pkg/cleanup: each step that makes something registers how to
// undo it, a deferred Clean undoes in reverse what was registered, and Release, called
// once everything succeeded, keeps it all.
//
//	var cu cleanup.Stack
//	defer cu.Clean(ctx)
//	dir, err := makeDir()
//	...
//	cu.Add(func(ctx context.Context) { os.RemoveAll(dir) })
//	...
//	cu.Release()
//
// The undo steps run on a context that the caller's cancellation does not reach (the
// caller's context is often why the operation failed), bounded by Timeout, as
// containerd's internal/cleanup does.
package cleanup

import (
	"context"
	"time"
)

// Timeout bounds how long a Clean may run in all.
const Timeout = 30 * time.Second

// Stack is a list of undo steps. The zero value is ready to use; it is not safe for
// concurrent use.
type Stack struct {
	steps []func(context.Context)
}

// Add registers an undo step.
func (s *Stack) Add(f func(ctx context.Context)) { s.steps = append(s.steps, f) }

// Release forgets every undo step: the work is kept.
func (s *Stack) Release() { s.steps = nil }

// Clean runs the registered steps, the last added first, and forgets them. The steps
// get ctx's values but not its cancellation, and at most Timeout in all.
func (s *Stack) Clean(ctx context.Context) {
	if len(s.steps) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	for i := len(s.steps) - 1; i >= 0; i-- {
		s.steps[i](ctx)
	}
	s.steps = nil
}
