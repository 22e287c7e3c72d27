package guestfwd

import (
	"context"
	"errors"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
)

var (
	_ roche.DirWalker  = Forwarder{}
	_ roche.DirWatcher = Forwarder{}
)

// WalkDir implements roche.DirWalker.
func (f Forwarder) WalkDir(ctx context.Context, id, dir string, depth, maxEntries int, fn func(roche.FileInfo) error) error {
	depth, err := kit.ListDepth(depth)
	if err != nil {
		return err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	if maxEntries <= 0 || maxEntries > roche.MaxListEntries {
		maxEntries = roche.MaxListEntries
	}
	var fnErr error
	err = t.Agent.Walk(ctx, dir, depth, maxEntries, func(batch []guest.FileInfo) error {
		for _, fi := range batch {
			if fnErr = fn(FileInfo(fi)); fnErr != nil {
				return fnErr
			}
		}
		return nil
	})
	if fnErr != nil {
		return fnErr
	}
	return t.failOrNil(err)
}

// WatchDir implements roche.DirWatcher: inotify in the agent, its queue bounded there.
func (f Forwarder) WatchDir(ctx context.Context, id, dir string, opts roche.WatchOptions, fn func(roche.FileEvent) error) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	var fnErr error
	err = t.Agent.Watch(ctx, dir, opts.Recursive, opts.Started, func(batch []guest.FileEvent) error {
		for _, ev := range batch {
			if fnErr = fn(roche.FileEvent{Name: ev.Name, Op: roche.FileOp(ev.Op), Lost: ev.Lost}); fnErr != nil {
				return fnErr
			}
		}
		return nil
	})
	switch {
	case fnErr != nil:
		return fnErr
	case errors.Is(err, guest.ErrWatchEnded):
		return nil
	}
	return t.failOrNil(err)
}
