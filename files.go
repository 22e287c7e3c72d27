package roche

import (
	"context"
	"io/fs"
)

// The files API beyond FileSystem's single calls: a directory listed to a depth in one
// call, and a directory watched for changes. Both are optional interfaces of a provider
// (every provider that runs roche-agent has them; wasm walks, and polls for its watches).

// DirWalker lists a directory tree in one call.
type DirWalker interface {
	// WalkDir calls fn with each entry below dir down to depth levels (1: dir's own
	// entries), each directory's entries in name order before what is below them. No
	// symlink is followed (a link is listed, not entered) and nothing in /proc is served.
	// More than maxEntries entries (0: MaxListEntries) is ErrExhausted; depth is 1 to
	// MaxListDepth.
	WalkDir(ctx context.Context, id, dir string, depth, maxEntries int, fn func(FileInfo) error) error
}

// DirWatcher reports changes below a directory as they happen.
type DirWatcher interface {
	// WatchDir watches dir (and, with Recursive, every directory below it, later ones
	// included) and calls fn with each change, from one goroutine, until ctx ends (nil
	// is returned), fn returns an error (returned), or the directory itself is removed or
	// renamed: its own event (Name "") is the last, and nil is returned. Events a slow fn
	// cannot take are dropped and counted in a FileOverflow event, never silently.
	WatchDir(ctx context.Context, id, dir string, opts WatchOptions, fn func(FileEvent) error) error
}

// WatchOptions says what a watch covers.
type WatchOptions struct {
	// Recursive watches every directory below the watched one too.
	Recursive bool
	// Started, when set, is called once the watch is in place: every change after it is
	// reported.
	Started func()
}

// FileEvent is one change below a watched directory.
type FileEvent struct {
	// Name is the changed path relative to the watched directory ("" for the directory
	// itself, in the last event of a watch whose directory went).
	Name string `json:"name"`
	// Op is what happened to it.
	Op FileOp `json:"type"`
	// Lost, in a FileOverflow event, counts the events dropped before it; 0 when the
	// count is unknown (the kernel's own queue overflowed).
	Lost int64 `json:"lost,omitempty"`
}

// FileOp is the kind of a FileEvent, named as E2B's SDKs name them.
type FileOp string

// File event kinds. A rename reports the old name as FileRename and the new one, when it
// is inside the watched tree, as FileCreate.
const (
	FileCreate   FileOp = "create"
	FileWrite    FileOp = "write"
	FileRemove   FileOp = "remove"
	FileRename   FileOp = "rename"
	FileChmod    FileOp = "chmod" // permissions, owner or times changed
	FileOverflow FileOp = "overflow"
)

// Limits of the files API.
const (
	// MaxListEntries bounds one listing (WalkDir, ListDir through roched).
	MaxListEntries = 100_000
	// MaxListDepth bounds the depth of one listing.
	MaxListDepth = 64
)

// FileType names what a FileInfo describes: "file", "dir", "symlink", or, for what
// the files API neither reads nor writes, "fifo", "socket" or "device".
func (fi FileInfo) FileType() string {
	switch {
	case fi.Mode&fs.ModeSymlink != 0:
		return "symlink"
	case fi.IsDir || fi.Mode.IsDir():
		return "dir"
	case fi.Mode&fs.ModeNamedPipe != 0:
		return "fifo"
	case fi.Mode&fs.ModeSocket != 0:
		return "socket"
	case fi.Mode&fs.ModeDevice != 0:
		return "device"
	}
	return "file"
}
