package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Watches roched holds for a tenant: its WatchDir streams and its watchers (CreateWatcher,
// for clients that poll instead of keeping a stream open). Each tenant has at most
// MaxWatchesPerTenant of them; each watcher holds at most watcherQueue events between two
// polls (the rest is counted in an overflow event) and is removed when it has not been
// polled for watcherIdle, or when its watch ended and what it held was taken.

const (
	watcherQueue = 10_000
	watcherIdle  = 10 * time.Minute
)

// watchCounter counts each tenant's open watches.
type watchCounter struct {
	mu sync.Mutex
	n  map[string]int
}

// take counts one more watch for tenant, or refuses past the limit.
func (c *watchCounter) take(tenant string) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	if c.n[tenant] >= MaxWatchesPerTenant {
		return nil, fmt.Errorf("%w: %d watches are open already, the most one caller may have: stop one (end a WatchDir, RemoveWatcher) first",
			roche.ErrExhausted, MaxWatchesPerTenant)
	}
	c.n[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			c.n[tenant]--
			c.mu.Unlock()
		})
	}, nil
}

// watcher is one CreateWatcher's watch and the events it gathered.
type watcher struct {
	tenant  string
	sandbox string
	cancel  context.CancelFunc
	release func()

	mu     sync.Mutex
	events []roche.FileEvent
	lost   int64
	ended  bool
	err    error
	polled time.Time
}

func (w *watcher) add(ev roche.FileEvent) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events) >= watcherQueue {
		w.lost++
		if ev.Op == roche.FileOverflow {
			w.lost += ev.Lost
		}
		return nil
	}
	w.events = append(w.events, ev)
	return nil
}

// take returns what the watcher gathered (losses last, as an overflow event) and
// whether it is over: ended, with nothing more to give.
func (w *watcher) take() ([]roche.FileEvent, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.polled = time.Now()
	events := w.events
	w.events = nil
	if w.lost > 0 {
		events = append(events, roche.FileEvent{Op: roche.FileOverflow, Lost: w.lost})
		w.lost = 0
	}
	if w.ended && len(events) == 0 {
		return nil, true, w.err
	}
	return events, false, nil
}

// watcherSet is the daemon's watchers by id.
type watcherSet struct {
	mu   sync.Mutex
	byID map[string]*watcher
	once sync.Once
}

func (s *watcherSet) get(tenant, id string) (*watcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.byID[id]
	if !ok || w.tenant != tenant {
		return nil, fmt.Errorf("%w: no watcher %q (it was removed, its sandbox is gone, or it was not polled for %s)", roche.ErrNotFound, id, watcherIdle)
	}
	return w, nil
}

func (s *watcherSet) remove(id string) {
	s.mu.Lock()
	w, ok := s.byID[id]
	delete(s.byID, id)
	s.mu.Unlock()
	if ok {
		w.cancel()
	}
}

// sweep removes the watchers not polled for watcherIdle, until the daemon drains, when
// it removes them all.
func (d *Daemon) sweepWatchers() {
	t := time.NewTicker(watcherIdle / 10)
	defer t.Stop()
	for {
		select {
		case <-d.draining:
			d.watchers.mu.Lock()
			ids := make([]string, 0, len(d.watchers.byID))
			for id := range d.watchers.byID {
				ids = append(ids, id)
			}
			d.watchers.mu.Unlock()
			for _, id := range ids {
				d.watchers.remove(id)
			}
			return
		case now := <-t.C:
			d.watchers.mu.Lock()
			var idle []string
			for id, w := range d.watchers.byID {
				w.mu.Lock()
				if now.Sub(w.polled) > watcherIdle {
					idle = append(idle, id)
				}
				w.mu.Unlock()
			}
			d.watchers.mu.Unlock()
			for _, id := range idle {
				d.log.Info("watcher removed: not polled", "watcher", id, "idle", watcherIdle)
				d.watchers.remove(id)
			}
		}
	}
}

func (s *service) CreateWatcher(ctx context.Context, req *connect.Request[rochev1.CreateWatcherRequest]) (*connect.Response[rochev1.CreateWatcherResponse], error) {
	p, err := sandboxFilePath("path", req.Msg.Path)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, dw, release, err := s.d.dirWatcher(ctx, req.Msg.SandboxId)
	if err != nil {
		s.d.audit(ctx, "create_watcher", err, "id", req.Msg.SandboxId, "path", p)
		return nil, wire.ToStatus(err)
	}
	tn, _ := tenantOf(ctx)
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	// The watch outlives this call: it is roched's, until removed, idle or drained.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &watcher{tenant: tn.Name, sandbox: t.ID, cancel: cancel, release: release, polled: time.Now()}
	started := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		defer release()
		err := dw.WatchDir(wctx, t.ID, p, roche.WatchOptions{Recursive: req.Msg.Recursive, Started: func() { close(started) }}, w.add)
		w.mu.Lock()
		w.ended, w.err = true, err
		w.mu.Unlock()
		ended <- err
	}()
	select {
	case <-started:
	case err = <-ended:
		if err == nil {
			err = fmt.Errorf("%w: the watch of %s ended before it started", roche.ErrNotFound, p)
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.d.audit(ctx, "create_watcher", err, "id", t.ID, "path", p, "watcher", id)
	if err != nil {
		cancel()
		return nil, wire.ToStatus(err)
	}
	s.d.watchers.once.Do(func() {
		s.d.bg.Add(1)
		go func() {
			defer s.d.bg.Done()
			s.d.sweepWatchers()
		}()
	})
	s.d.watchers.mu.Lock()
	if s.d.watchers.byID == nil {
		s.d.watchers.byID = map[string]*watcher{}
	}
	s.d.watchers.byID[id] = w
	s.d.watchers.mu.Unlock()
	return connect.NewResponse(&rochev1.CreateWatcherResponse{WatcherId: id}), nil
}

func (s *service) GetWatcherEvents(ctx context.Context, req *connect.Request[rochev1.GetWatcherEventsRequest]) (*connect.Response[rochev1.GetWatcherEventsResponse], error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	w, err := s.d.watchers.get(tn.Name, req.Msg.WatcherId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	events, over, err := w.take()
	if over {
		s.d.watchers.remove(req.Msg.WatcherId)
		if err == nil {
			err = fmt.Errorf("%w: watcher %s ended: its directory was removed or renamed (its last event said so)", roche.ErrNotFound, req.Msg.WatcherId)
		}
		return nil, wire.ToStatus(fmt.Errorf("watcher %s: %w", req.Msg.WatcherId, err))
	}
	out := &rochev1.GetWatcherEventsResponse{Events: make([]*rochev1.FileEvent, len(events))}
	for i, ev := range events {
		out.Events[i] = wire.FileEventToProto(ev)
	}
	return connect.NewResponse(out), nil
}

func (s *service) RemoveWatcher(ctx context.Context, req *connect.Request[rochev1.RemoveWatcherRequest]) (*connect.Response[rochev1.RemoveWatcherResponse], error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	if _, err := s.d.watchers.get(tn.Name, req.Msg.WatcherId); err != nil {
		return nil, wire.ToStatus(err)
	}
	s.d.watchers.remove(req.Msg.WatcherId)
	s.d.audit(ctx, "remove_watcher", nil, "watcher", req.Msg.WatcherId)
	return connect.NewResponse(&rochev1.RemoveWatcherResponse{}), nil
}
