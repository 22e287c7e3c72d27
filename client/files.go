package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/kit"
)

// The files API through the daemon (its ReadFile ... RemoveWatcher), streamed both ways:
// nothing is staged on either side, so a file of any size moves in bounded memory.

var (
	_ roche.FileSystem = (*Provider)(nil)
	_ roche.DirWalker  = (*Provider)(nil)
	_ roche.DirWatcher = (*Provider)(nil)
)

// fileChunk is the size of each uploaded piece of a file.
const fileChunk = 256 << 10

// WriteFile implements roche.FileSystem: r is uploaded as it is read, replacing path
// and making its missing parents, under the daemon's cap (roched --copy-max-bytes).
func (p *Provider) WriteFile(ctx context.Context, id, dst string, r io.Reader, mode fs.FileMode) error {
	_, err := p.WriteFileLimit(ctx, id, dst, r, mode, 0)
	return err
}

// WriteFileLimit is WriteFile with a cap on the content (0: the daemon's), reporting
// what was written. A write over the cap, or past the sandbox's disk space, is
// roche.ErrExhausted and leaves no file.
func (p *Provider) WriteFileLimit(ctx context.Context, id, dst string, r io.Reader, mode fs.FileMode, maxBytes int64) (roche.FileInfo, error) {
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return roche.FileInfo{}, fmt.Errorf("%w: path %q must be an absolute path below /, e.g. /tmp/data.txt", roche.ErrInvalidConfig, dst)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := p.c.rpc.WriteFile(ctx)
	first := true
	buf := make([]byte, fileChunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 || first {
			msg := &rochev1.WriteFileRequest{Data: buf[:n]}
			if first {
				msg.SandboxId, msg.Path, msg.Mode, msg.MaxBytes, first = id, dst, uint32(mode.Perm()), max(maxBytes, 0), false
			}
			if err := stream.Send(msg); err != nil {
				// The daemon refused (unknown sandbox, over the cap, no space): its reason comes with the close.
				_, cerr := stream.CloseAndReceive()
				if cerr != nil {
					return roche.FileInfo{}, p.c.fromRPC(cerr)
				}
				return roche.FileInfo{}, p.c.fromRPC(err)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			// Cancelled before the end: the daemon and the agent drop the file.
			cancel()
			_, _ = stream.CloseAndReceive()
			return roche.FileInfo{}, fmt.Errorf("reading the content for %s: %w", dst, rerr)
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return roche.FileInfo{}, p.c.fromRPC(err)
	}
	return wire.FileEntryFromProto(resp.Msg.Entry), nil
}

// ReadFile implements roche.FileSystem: the file's content as it streams, refusing one
// over the daemon's cap (see ReadFileLimit).
func (p *Provider) ReadFile(ctx context.Context, id, src string, w io.Writer) error {
	_, err := p.ReadFileLimit(ctx, id, src, w, 0)
	return err
}

// ReadFileLimit streams the sandbox file at src to w and returns its description (the
// size it had when the read began; no more than that is sent). A file over maxBytes (0:
// the daemon's cap, roched --copy-max-bytes) is roche.ErrExhausted before any of it is
// written to w; a directory, FIFO or device is ErrInvalidConfig; a symlink ErrPermission.
func (p *Provider) ReadFileLimit(ctx context.Context, id, src string, w io.Writer, maxBytes int64) (roche.FileInfo, error) {
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return roche.FileInfo{}, fmt.Errorf("%w: path %q must be an absolute path below /, e.g. /tmp/data.txt", roche.ErrInvalidConfig, src)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.c.rpc.ReadFile(ctx, connect.NewRequest(&rochev1.ReadFileRequest{SandboxId: id, Path: src, MaxBytes: max(maxBytes, 0)}))
	if err != nil {
		return roche.FileInfo{}, p.c.fromRPC(err)
	}
	defer stream.Close()
	var fi roche.FileInfo
	for stream.Receive() {
		msg := stream.Msg()
		if msg.Entry != nil {
			fi = wire.FileEntryFromProto(msg.Entry)
		}
		if len(msg.Data) > 0 {
			if _, err := w.Write(msg.Data); err != nil {
				cancel() // the writer gave up: the rest is of no use
				return fi, err
			}
		}
	}
	return fi, p.c.fromRPC(stream.Err())
}

// ListDir implements roche.FileSystem: the directory's entries.
func (p *Provider) ListDir(ctx context.Context, id, dir string) ([]roche.FileInfo, error) {
	var out []roche.FileInfo
	err := p.WalkDir(ctx, id, dir, 1, 0, func(fi roche.FileInfo) error {
		out = append(out, fi)
		return nil
	})
	return out, err
}

// WalkDir implements roche.DirWalker in one call; the daemon lists at most
// roche.MaxListEntries, and maxEntries is applied here.
func (p *Provider) WalkDir(ctx context.Context, id, dir string, depth, maxEntries int, fn func(roche.FileInfo) error) error {
	depth, err := kit.ListDepth(depth)
	if err != nil {
		return err
	}
	resp, err := p.c.rpc.ListDir(ctx, connect.NewRequest(&rochev1.ListDirRequest{SandboxId: id, Path: dir, Depth: uint32(depth)}))
	if err != nil {
		return p.c.fromRPC(err)
	}
	if maxEntries > 0 && len(resp.Msg.Entries) > maxEntries {
		return fmt.Errorf("%w: %s holds more than %d entries to depth %d: list less deep, or a directory below it",
			roche.ErrExhausted, dir, maxEntries, depth)
	}
	for _, e := range resp.Msg.Entries {
		if err := fn(wire.FileEntryFromProto(e)); err != nil {
			return err
		}
	}
	return nil
}

// Stat implements roche.FileSystem.
func (p *Provider) Stat(ctx context.Context, id, name string) (roche.FileInfo, error) {
	resp, err := p.c.rpc.Stat(ctx, connect.NewRequest(&rochev1.StatRequest{SandboxId: id, Path: name}))
	if err != nil {
		return roche.FileInfo{}, p.c.fromRPC(err)
	}
	return wire.FileEntryFromProto(resp.Msg.Entry), nil
}

// Exists reports whether name exists in the sandbox (a symlink counts, whatever it
// points to); an unknown sandbox is ErrNotFound, not false.
func (p *Provider) Exists(ctx context.Context, id, name string) (bool, error) {
	resp, err := p.c.rpc.Stat(ctx, connect.NewRequest(&rochev1.StatRequest{SandboxId: id, Path: name, MissingOk: true}))
	if err != nil {
		return false, p.c.fromRPC(err)
	}
	return resp.Msg.Exists, nil
}

// Mkdir implements roche.FileSystem: the directory and its missing parents.
func (p *Provider) Mkdir(ctx context.Context, id, dir string) error {
	_, _, err := p.MakeDir(ctx, id, dir)
	return err
}

// MakeDir makes dir and its missing parents, reporting whether it made it (false: it
// was a directory already).
func (p *Provider) MakeDir(ctx context.Context, id, dir string) (roche.FileInfo, bool, error) {
	resp, err := p.c.rpc.MakeDir(ctx, connect.NewRequest(&rochev1.MakeDirRequest{SandboxId: id, Path: dir}))
	if err != nil {
		return roche.FileInfo{}, false, p.c.fromRPC(err)
	}
	return wire.FileEntryFromProto(resp.Msg.Entry), resp.Msg.Created, nil
}

// Remove implements roche.FileSystem.
func (p *Provider) Remove(ctx context.Context, id, name string) error {
	_, err := p.c.rpc.Remove(ctx, connect.NewRequest(&rochev1.RemoveRequest{SandboxId: id, Path: name}))
	return p.c.fromRPC(err)
}

// Rename implements roche.FileSystem.
func (p *Provider) Rename(ctx context.Context, id, from, to string) error {
	_, err := p.c.rpc.Rename(ctx, connect.NewRequest(&rochev1.RenameRequest{SandboxId: id, Source: from, Destination: to}))
	return p.c.fromRPC(err)
}

// WatchDir implements roche.DirWatcher over the daemon's WatchDir stream.
func (p *Provider) WatchDir(ctx context.Context, id, dir string, opts roche.WatchOptions, fn func(roche.FileEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.c.rpc.WatchDir(ctx, connect.NewRequest(&rochev1.WatchDirRequest{SandboxId: id, Path: dir, Recursive: opts.Recursive}))
	if err != nil {
		return p.c.fromRPC(err)
	}
	defer stream.Close()
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *rochev1.WatchDirResponse_Started:
			if opts.Started != nil {
				opts.Started()
			}
		case *rochev1.WatchDirResponse_File:
			fe, err := wire.FileEventFromProto(ev.File)
			if err != nil {
				return err
			}
			if err := fn(fe); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return p.c.fromRPC(stream.Err())
}

// CreateWatcher starts a watch that the daemon holds for a caller that polls
// (WatcherEvents) rather than keeping a stream open; RemoveWatcher stops it.
func (c *Client) CreateWatcher(ctx context.Context, id, dir string, recursive bool) (string, error) {
	resp, err := c.rpc.CreateWatcher(ctx, connect.NewRequest(&rochev1.CreateWatcherRequest{SandboxId: id, Path: dir, Recursive: recursive}))
	if err != nil {
		return "", c.fromRPC(err)
	}
	return resp.Msg.WatcherId, nil
}

// WatcherEvents returns what the watcher gathered since the last call. Once its watch
// has ended and everything was taken, it is roche.ErrNotFound (the directory went) or
// the error that ended it.
func (c *Client) WatcherEvents(ctx context.Context, watcherID string) ([]roche.FileEvent, error) {
	resp, err := c.rpc.GetWatcherEvents(ctx, connect.NewRequest(&rochev1.GetWatcherEventsRequest{WatcherId: watcherID}))
	if err != nil {
		return nil, c.fromRPC(err)
	}
	out := make([]roche.FileEvent, 0, len(resp.Msg.Events))
	for _, e := range resp.Msg.Events {
		fe, err := wire.FileEventFromProto(e)
		if err != nil {
			return out, err
		}
		out = append(out, fe)
	}
	return out, nil
}

// RemoveWatcher stops a watcher.
func (c *Client) RemoveWatcher(ctx context.Context, watcherID string) error {
	_, err := c.rpc.RemoveWatcher(ctx, connect.NewRequest(&rochev1.RemoveWatcherRequest{WatcherId: watcherID}))
	return c.fromRPC(err)
}
