package wasm

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var (
	_ roche.DirWalker  = (*Provider)(nil)
	_ roche.DirWatcher = (*Provider)(nil)
)

// WalkDir implements roche.DirWalker, one directory at a time through ListDir, so a
// walk that crosses into /tmp, /workspace or a mount follows the sandbox's mapping.
func (p *Provider) WalkDir(ctx context.Context, id, dir string, depth, maxEntries int, fn func(roche.FileInfo) error) error {
	depth, err := kit.ListDepth(depth)
	if err != nil {
		return err
	}
	if maxEntries <= 0 || maxEntries > roche.MaxListEntries {
		maxEntries = roche.MaxListEntries
	}
	left := maxEntries
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		list, err := p.ListDir(ctx, id, dir)
		if err != nil {
			return err
		}
		if len(list) > left {
			return fmt.Errorf("%w: %s holds more than %d entries to depth %d: list less deep, or a directory below it",
				roche.ErrExhausted, dir, maxEntries, depth)
		}
		left -= len(list)
		for _, fi := range list {
			if err := fn(fi); err != nil {
				return err
			}
		}
		if level == depth {
			return nil
		}
		for _, fi := range list {
			if fi.FileType() != "dir" {
				continue
			}
			if err := walk(fi.Path, level+1); err != nil && !errors.Is(err, roche.ErrNotFound) {
				return err // a directory removed meanwhile is listed, not entered
			}
		}
		return nil
	}
	return walk(dir, 1)
}

// pollInterval is how often a wasm watch looks for changes.
const pollInterval = 250 * time.Millisecond

// maxPolledEntries bounds what one wasm watch compares on each look.
const maxPolledEntries = 10_000

// polled is what a watch remembers of one entry.
type polled struct {
	size    int64
	modTime time.Time
	mode    uint32
	dir     bool
}

// WatchDir implements roche.DirWatcher by polling: a wasm sandbox has no kernel of its
// own to ask, and its files are host directories that roched looks at every
// pollInterval, comparing what it sees with what it saw. So a change is reported up to
// a quarter second late; a file made and removed between two looks is not reported; a
// rename is reported as the old name removed and the new one created; a write that
// keeps the size and the modification time is missed. A slow fn delays the next look
// (changes are then reported together), so nothing queues up.
func (p *Provider) WatchDir(ctx context.Context, id, dir string, opts roche.WatchOptions, fn func(roche.FileEvent) error) error {
	depth := 1
	if opts.Recursive {
		depth = roche.MaxListDepth
	}
	look := func() (map[string]polled, error) {
		seen := map[string]polled{}
		err := p.WalkDir(ctx, id, dir, depth, maxPolledEntries, func(fi roche.FileInfo) error {
			seen[strings.TrimPrefix(fi.Path, path.Clean(dir)+"/")] = polled{size: fi.Size, modTime: fi.ModTime, mode: uint32(fi.Mode), dir: fi.Mode.IsDir()}
			return nil
		})
		if errors.Is(err, roche.ErrExhausted) {
			err = fmt.Errorf("%w: %s holds more than %d entries, the most a wasm watch compares: watch a directory below it",
				roche.ErrExhausted, dir, maxPolledEntries)
		}
		return seen, err
	}
	if fi, err := p.Stat(ctx, id, dir); err != nil {
		return err
	} else if !fi.Mode.IsDir() {
		return fmt.Errorf("%w: %s is not a directory: watch the directory holding it", roche.ErrInvalidConfig, dir)
	}
	before, err := look()
	if err != nil {
		return err
	}
	if opts.Started != nil {
		opts.Started()
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		now, err := look()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, roche.ErrNotFound) {
			return fn(roche.FileEvent{Name: "", Op: roche.FileRemove})
		}
		if err != nil {
			return err
		}
		for _, ev := range diff(before, now) {
			if err := fn(ev); err != nil {
				return err
			}
		}
		before = now
	}
}

// diff is what changed from before to now, removals first, each kind in name order.
func diff(before, now map[string]polled) []roche.FileEvent {
	var removed, created, changed []roche.FileEvent
	for name := range before {
		if _, ok := now[name]; !ok {
			removed = append(removed, roche.FileEvent{Name: name, Op: roche.FileRemove})
		}
	}
	for name, n := range now {
		b, ok := before[name]
		switch {
		case !ok:
			created = append(created, roche.FileEvent{Name: name, Op: roche.FileCreate})
		case n.mode != b.mode:
			changed = append(changed, roche.FileEvent{Name: name, Op: roche.FileChmod})
		case !n.dir && (n.size != b.size || !n.modTime.Equal(b.modTime)):
			changed = append(changed, roche.FileEvent{Name: name, Op: roche.FileWrite})
		}
	}
	out := append(sortEvents(removed), sortEvents(created)...)
	return append(out, sortEvents(changed)...)
}

func sortEvents(evs []roche.FileEvent) []roche.FileEvent {
	slices.SortFunc(evs, func(a, b roche.FileEvent) int { return strings.Compare(a.Name, b.Name) })
	return evs
}
