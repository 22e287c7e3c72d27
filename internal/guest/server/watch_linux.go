package server

import (
	"errors"
	"fmt"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest"
)

// Watches (OpWatch): inotify, in the agent. The inotify instance is made with the
// sandbox user's effective uid, so it and its watches count against that user's own
// kernel limits (fs.inotify.max_user_instances and max_user_watches, per uid), exactly
// as the sandboxed code's would, and never against root's, which the host shares. Every
// directory is watched through a descriptor opened without following a symlink
// (/proc/self/fd/N), as the sandbox user, so a watch covers only what that user could
// list. Events go through a bounded queue (guest.WatchQueue): a client reading slower
// than they come loses the excess, counted in an overflow event, never silently.

// watchMask is what a watched directory reports.
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_ATTRIB |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watchBatch is how many events one frame carries at most.
const watchBatch = 256

// watchSlots counts the agent's open watches (at most guest.MaxWatches).
type watchSlots struct {
	mu sync.Mutex
	n  int
}

// watchSlot takes one of the agent's watches, or refuses.
func (s *Server) watchSlot() bool {
	s.watches.mu.Lock()
	defer s.watches.mu.Unlock()
	if s.watches.n >= guest.MaxWatches {
		return false
	}
	s.watches.n++
	return true
}

func (s *Server) watchDone() {
	s.watches.mu.Lock()
	s.watches.n--
	s.watches.mu.Unlock()
}

func exhausted(format string, args ...any) error {
	return &guest.Error{Code: guest.CodeExhausted, Message: fmt.Sprintf(format, args...)}
}

// watch serves one OpWatch connection until the client closes it, the directory goes or
// the watch fails.
func (s *Server) watch(c *conn, p string, req guest.Request) error {
	if !s.watchSlot() {
		return exhausted("this sandbox already has %d watches open, the most it may: stop one first", guest.MaxWatches)
	}
	defer s.watchDone()
	w := &watcher{s: s, root: p, recursive: req.Recursive, dirs: map[int32]string{}, moves: map[uint32]string{},
		q: newEventQueue(guest.WatchQueue), ifd: -1}
	if err := w.start(); err != nil {
		return err
	}
	defer w.close()
	if err := c.sendJSON(guest.FrameReply, struct{}{}); err != nil {
		return nil
	}
	go w.read()
	// The client sends nothing more: a read ends when it closes the connection.
	gone := make(chan struct{})
	go func() {
		_, _, _ = c.read()
		close(gone)
	}()
	for {
		select {
		case <-w.q.ready:
		case <-gone:
			return nil
		}
		events, end, err := w.q.take()
		for len(events) > 0 {
			n := min(len(events), watchBatch)
			if serr := c.sendJSON(guest.FrameEvents, events[:n]); serr != nil {
				return nil
			}
			events = events[n:]
		}
		if end {
			if err != nil {
				return err
			}
			return c.send(guest.FrameDataEOF, nil)
		}
	}
}

// eventQueue holds a watch's events between the inotify reader and the connection, at
// most max of them and maxQueueBytes of their names (the sandbox's code chooses how long
// those are, and the agent's memory is the sandbox's); what does not fit is counted and
// reported as an overflow event.
type eventQueue struct {
	mu     sync.Mutex
	events []guest.FileEvent
	bytes  int
	lost   int64
	max    int
	end    bool
	err    error
	ready  chan struct{} // signalled when there is something to take
}

// maxQueueBytes bounds the names a watch's queue holds.
const maxQueueBytes = 1 << 20

func newEventQueue(max int) *eventQueue {
	return &eventQueue{max: max, ready: make(chan struct{}, 1)}
}

func (q *eventQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// push queues ev, or counts it lost when the queue is full. The overflow event that
// reports losses takes a place of its own, before the next event that fits.
func (q *eventQueue) push(ev guest.FileEvent) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.end {
		return
	}
	if q.lost > 0 && len(q.events) < q.max {
		q.events = append(q.events, guest.FileEvent{Op: guest.EventOverflow, Lost: q.lost})
		q.lost = 0
	}
	if len(q.events) >= q.max || q.bytes+len(ev.Name) > maxQueueBytes {
		q.lost++
		return
	}
	q.events = append(q.events, ev)
	q.bytes += len(ev.Name)
	q.signal()
}

// overflow reports the kernel's own queue having overflowed (how much is unknown).
func (q *eventQueue) overflow() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := len(q.events); n > 0 && q.events[n-1].Op == guest.EventOverflow {
		return
	}
	if len(q.events) < q.max {
		q.events = append(q.events, guest.FileEvent{Op: guest.EventOverflow, Lost: q.lost})
		q.lost = 0
	} else {
		q.lost++
	}
	q.signal()
}

// finish ends the queue: after what it holds, the watch ends with err (nil: the
// directory went).
func (q *eventQueue) finish(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.end {
		return
	}
	q.end, q.err = true, err
	q.signal()
}

// take returns what is queued (a pending loss count as an overflow event last), and
// whether the watch ends with it.
func (q *eventQueue) take() ([]guest.FileEvent, bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	events := q.events
	q.events, q.bytes = nil, 0
	if q.lost > 0 {
		events = append(events, guest.FileEvent{Op: guest.EventOverflow, Lost: q.lost})
		q.lost = 0
	}
	return events, q.end, q.err
}

// watcher is one watch: its inotify instance and the directories it covers.
type watcher struct {
	s         *Server
	root      string
	recursive bool
	q         *eventQueue

	ifd  int
	file *os.File // ifd, read through the runtime's poller

	mu    sync.Mutex
	dirs  map[int32]string  // watch descriptor → directory relative to root ("" for root)
	moves map[uint32]string // cookie → directory moved away, until its arrival is seen
	rootW int32
}

// start makes the inotify instance as the sandbox user and watches the root (and, when
// recursive, every directory below it).
func (w *watcher) start() error {
	err := w.s.asUserEffective(func() error {
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			if errors.Is(err, unix.EMFILE) {
				return exhausted("the sandbox user's inotify instances are used up (fs.inotify.max_user_instances): stop a watch, or what in the sandbox holds them")
			}
			return fmt.Errorf("making an inotify instance: %w", err)
		}
		w.ifd = fd
		dir, err := openNoFollow(w.root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		if err := checkNotProc(dir, w.root); err != nil {
			unix.Close(dir)
			return err
		}
		wd, err := w.add(dir, "", nil)
		w.rootW = wd
		return err
	})
	if err != nil {
		if w.ifd >= 0 {
			unix.Close(w.ifd)
		}
		return err
	}
	w.file = os.NewFile(uintptr(w.ifd), "inotify")
	return nil
}

func (w *watcher) close() {
	if w.file != nil {
		w.file.Close()
	}
}

// add watches the open directory dir (rel to the root), closing it, and when recursive
// every directory below it; with found set, each entry found below is reported to it
// (what a directory made or moved in held before its watch was in place).
func (w *watcher) add(dir int, rel string, found func(string)) (int32, error) {
	d := os.NewFile(uintptr(dir), rel) // owns dir, used by number while open
	defer d.Close()
	wd, err := w.addFD(dir, rel)
	if err != nil || !w.recursive {
		return wd, err
	}
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		child := path.Join(rel, n)
		var st unix.Stat_t
		if unix.Fstatat(dir, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		if found != nil {
			found(child)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := unix.Openat(dir, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // gone or not the user's to read: not watched, as it could not be listed
		}
		if onProcFD(sub) {
			unix.Close(sub)
			continue
		}
		if _, err := w.add(sub, child, found); err != nil {
			return wd, err
		}
	}
	return wd, nil
}

// addFD puts a watch on the directory open as fd.
func (w *watcher) addFD(fd int, rel string) (int32, error) {
	w.mu.Lock()
	n := len(w.dirs)
	w.mu.Unlock()
	if n >= guest.MaxWatchedDirs {
		return -1, exhausted("%s holds more than %d directories, the most one watch covers: watch a directory below it", w.root, guest.MaxWatchedDirs)
	}
	// The descriptor's own /proc link names exactly the directory opened, whatever was
	// renamed or swapped since; without /proc, the path (its last part not followed).
	wd, err := unix.InotifyAddWatch(w.ifd, "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	if errors.Is(err, unix.ENOENT) {
		wd, err = unix.InotifyAddWatch(w.ifd, path.Join(w.root, rel), watchMask|unix.IN_DONT_FOLLOW)
	}
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return -1, exhausted("the sandbox user's inotify watches are used up (fs.inotify.max_user_watches): watch a smaller tree")
		}
		return -1, fileErr(path.Join(w.root, rel), err)
	}
	w.mu.Lock()
	w.dirs[int32(wd)] = rel
	w.mu.Unlock()
	return int32(wd), nil
}

// addLater watches a directory that appeared below the root (made, or moved in), as the
// sandbox user, reporting what it already holds as created.
func (w *watcher) addLater(rel string) error {
	return w.s.asUser(func() error {
		p := path.Join(w.root, rel)
		dir, err := openNoFollow(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil // gone again, or swapped for a link: nothing to watch
		}
		if onProcFD(dir) {
			unix.Close(dir)
			return nil
		}
		_, err = w.add(dir, rel, func(child string) {
			w.q.push(guest.FileEvent{Name: child, Op: guest.EventCreate})
		})
		return err
	})
}

// forget drops the watches of rel and everything below it (moved out of the tree).
func (w *watcher) forget(rel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, d := range w.dirs {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			_, _ = unix.InotifyRmWatch(w.ifd, uint32(wd))
			delete(w.dirs, wd)
		}
	}
}

// moved renames rel's subtree to to (a directory moved within the tree).
func (w *watcher) moved(rel, to string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, d := range w.dirs {
		switch {
		case d == rel:
			w.dirs[wd] = to
		case strings.HasPrefix(d, rel+"/"):
			w.dirs[wd] = to + d[len(rel):]
		}
	}
}

// read turns inotify events into queued ones until the watch ends.
func (w *watcher) read() {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				w.q.finish(nil)
				return
			}
			w.q.finish(fmt.Errorf("reading the watch of %s: %w", w.root, err))
			return
		}
		if done, err := w.handle(buf[:n]); done {
			w.q.finish(err)
			return
		}
	}
}

// handle queues the events in one read; it reports whether the watch ends.
func (w *watcher) handle(b []byte) (bool, error) {
	for off := 0; off+unix.SizeofInotifyEvent <= len(b); {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[off]))
		nameBytes := b[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
		off += unix.SizeofInotifyEvent + int(ev.Len)
		name := strings.TrimRight(string(nameBytes), "\x00")
		if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
			w.q.overflow()
			continue
		}
		w.mu.Lock()
		rel, ok := w.dirs[ev.Wd]
		w.mu.Unlock()
		if !ok {
			continue // a watch already forgotten
		}
		isRoot := ev.Wd == w.rootW
		if ev.Mask&unix.IN_IGNORED != 0 {
			w.mu.Lock()
			delete(w.dirs, ev.Wd)
			w.mu.Unlock()
			if isRoot {
				return true, nil
			}
			continue
		}
		if ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0 {
			if !isRoot {
				continue // its parent's event named it
			}
			op := guest.EventRemove
			if ev.Mask&unix.IN_MOVE_SELF != 0 {
				op = guest.EventRename
			}
			w.q.push(guest.FileEvent{Name: "", Op: op})
			return true, nil
		}
		child := path.Join(rel, name)
		isDir := ev.Mask&unix.IN_ISDIR != 0
		switch {
		case ev.Mask&unix.IN_CREATE != 0:
			w.q.push(guest.FileEvent{Name: child, Op: guest.EventCreate})
			if isDir && w.recursive {
				if err := w.addLater(child); err != nil {
					return true, err
				}
			}
		case ev.Mask&unix.IN_MOVED_TO != 0:
			w.q.push(guest.FileEvent{Name: child, Op: guest.EventCreate})
			if isDir && w.recursive {
				w.mu.Lock()
				from, within := w.moves[ev.Cookie]
				delete(w.moves, ev.Cookie)
				w.mu.Unlock()
				if within {
					w.moved(from, child)
				} else if err := w.addLater(child); err != nil {
					return true, err
				}
			}
		case ev.Mask&unix.IN_MOVED_FROM != 0:
			w.q.push(guest.FileEvent{Name: child, Op: guest.EventRename})
			if isDir && w.recursive {
				w.mu.Lock()
				w.moves[ev.Cookie] = child
				w.mu.Unlock()
			}
		case ev.Mask&unix.IN_DELETE != 0:
			w.q.push(guest.FileEvent{Name: child, Op: guest.EventRemove})
		case ev.Mask&unix.IN_MODIFY != 0:
			w.q.push(guest.FileEvent{Name: child, Op: guest.EventWrite})
		case ev.Mask&unix.IN_ATTRIB != 0:
			w.q.push(guest.FileEvent{Name: child, Op: guest.EventChmod})
		}
	}
	// A directory moved away whose arrival this read did not hold left the tree.
	w.mu.Lock()
	gone := make([]string, 0, len(w.moves))
	for cookie, rel := range w.moves {
		gone = append(gone, rel)
		delete(w.moves, cookie)
	}
	w.mu.Unlock()
	for _, rel := range gone {
		w.forget(rel)
	}
	return false, nil
}

// asUserEffective runs fn on a thread whose effective uid and gid are the sandbox
// user's (and so its filesystem ones), with no supplementary groups: what the kernel
// charges to the caller's effective uid (an inotify instance) is then the user's.
func (s *Server) asUserEffective(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		euid, egid := os.Geteuid(), os.Getegid()
		if euid == s.uid && egid == s.gid {
			done <- fn()
			runtime.UnlockOSThread()
			return
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			done <- fmt.Errorf("dropping groups for file access: %w", e)
			return
		}
		if !switchEffective(s.uid, s.gid) {
			// Left locked: the runtime ends the thread with whatever it holds.
			done <- fmt.Errorf("switching to uid %d failed", s.uid)
			return
		}
		err := fn()
		if s.restoreIdentity(true, euid, egid) {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}
