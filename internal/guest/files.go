package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The files API's operations beyond the single-file ones in protocol.go: a directory
// listed to a depth, and a directory watched for changes.
const (
	// OpWalk lists what is below Path down to Depth levels (1: its entries), at most
	// MaxEntries of them: reply frames of JSON []FileInfo as they are read, then a
	// data-EOF frame. No symlink is followed.
	OpWalk = "walk"
	// OpWatch watches the directory Path (and, with Recursive, every directory below it,
	// those made later included) for changes: a reply frame once the watch is in place,
	// then event frames (JSON []FileEvent) until the client closes the connection, the
	// directory itself goes (its remove or rename event is the last) or the watch fails
	// (an error frame).
	OpWatch = "watch"
)

// FrameEvents carries a JSON []FileEvent of a watch (agent → client).
const FrameEvents = 'N'

// CodeTooLarge refuses a read of a file over the caller's cap (Request.MaxBytes) or a
// walk of too many entries; a watch past a limit of the agent or of the sandbox user's
// (inotify instances or watches) is CodeExhausted. Both are roche.ErrExhausted to a
// caller.
const CodeTooLarge = "too_large"

// File types, FileInfo.Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeFIFO    = "fifo"
	TypeSocket  = "socket"
	TypeDevice  = "device" // block or character
)

// FileEvent is one change below a watched directory.
type FileEvent struct {
	// Name is the changed path relative to the watched directory ("" for the directory
	// itself, in its last event).
	Name string `json:"name"`
	// Op is EventCreate, EventWrite, EventRemove, EventRename, EventChmod or
	// EventOverflow.
	Op string `json:"op"`
	// Lost, in an overflow event, is how many events were dropped because the reader
	// fell behind; 0 when the kernel's own queue overflowed and the count is unknown.
	Lost int64 `json:"lost,omitempty"`
}

// Event operations, FileEvent.Op, named as E2B's SDKs name them.
const (
	EventCreate   = "create"
	EventWrite    = "write"
	EventRemove   = "remove"
	EventRename   = "rename" // moved away (its new name, when inside, is a create)
	EventChmod    = "chmod"  // permissions, owner or times changed
	EventOverflow = "overflow"
)

// Limits of the agent's files API.
const (
	// MaxWalkEntries bounds one walk: a listing that would hold more is refused.
	MaxWalkEntries = 100_000
	// MaxWalkDepth bounds the depth a walk may be asked for.
	MaxWalkDepth = 64
	// MaxWatches bounds the watches one agent serves at once.
	MaxWatches = 64
	// MaxWatchedDirs bounds the directories one recursive watch covers.
	MaxWatchedDirs = 10_000
	// WatchQueue is how many events a watch holds for a client that reads slower than
	// they come; past it they are dropped and counted in an overflow event.
	WatchQueue = 4096
)

// Walk lists what is below path, to depth levels, calling fn with each batch as it
// arrives.
func (c *Client) Walk(ctx context.Context, path string, depth, maxEntries int, fn func([]FileInfo) error) error {
	s, err := c.open(ctx, Request{Op: OpWalk, Path: path, Depth: depth, MaxEntries: maxEntries})
	if err != nil {
		return err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	for {
		kind, p, err := s.read()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading from the sandbox agent: %w", err)
		}
		switch kind {
		case FrameReply:
			var batch []FileInfo
			if err := json.Unmarshal(p, &batch); err != nil {
				return fmt.Errorf("malformed agent listing: %w", err)
			}
			if err := fn(batch); err != nil {
				return err
			}
		case FrameDataEOF:
			return nil
		default:
			return decode(kind, p, FrameDataEOF, nil)
		}
	}
}

// ErrWatchEnded is what Watch returns when the watched directory itself went (removed
// or renamed): its last event said so.
var ErrWatchEnded = errors.New("the watched directory is gone")

// Watch watches path, calling started once the watch is in place and fn with each batch
// of events, until ctx ends (nil is returned then), fn fails, the directory goes
// (ErrWatchEnded) or the agent reports an error.
func (c *Client) Watch(ctx context.Context, path string, recursive bool, started func(), fn func([]FileEvent) error) error {
	s, err := c.open(ctx, Request{Op: OpWatch, Path: path, Recursive: recursive})
	if err != nil {
		return err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	for {
		kind, p, err := s.read()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading from the sandbox agent: %w", err)
		}
		switch kind {
		case FrameReply:
			if started != nil {
				started()
			}
		case FrameEvents:
			var batch []FileEvent
			if err := json.Unmarshal(p, &batch); err != nil {
				return fmt.Errorf("malformed agent events: %w", err)
			}
			if err := fn(batch); err != nil {
				return err
			}
		case FrameDataEOF:
			return ErrWatchEnded
		default:
			return decode(kind, p, FrameDataEOF, nil)
		}
	}
}

// ReadFileLimit streams path to w, refusing (CodeTooLarge) a file over maxBytes before
// any of it is sent; 0 means no cap.
func (c *Client) ReadFileLimit(ctx context.Context, path string, w io.Writer, maxBytes int64) error {
	return c.download(ctx, Request{Op: OpRead, Path: path, MaxBytes: maxBytes}, w)
}

// MkdirCreated makes a directory (and its parents when asked) and reports whether it
// made it (false: it was there already).
func (c *Client) MkdirCreated(ctx context.Context, path string, parents bool) (bool, error) {
	var r struct {
		Created bool `json:"created"`
	}
	err := c.call(ctx, Request{Op: OpMkdir, Path: path, Parents: parents}, &r)
	return r.Created, err
}
