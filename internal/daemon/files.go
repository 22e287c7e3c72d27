package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/api/roche/v1/rochev1connect"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/kit"
)

// The files API (sandbox.proto's ReadFile ... RemoveWatcher). Like copies, files are
// relayed, never staged: a read goes from the sandbox's agent to the client as it comes,
// a write from the client to the agent, each through a buffer of fileChunk, so a 1 GiB
// file costs roched no more memory than a small one. The size cap is the copies' (roched
// --copy-max-bytes); paths are checked here for their form and by the provider (the
// agent, in the sandbox) for what they lead to.

// fileChunk is the most content one ReadFile message carries.
const fileChunk = 256 << 10

// maxPathBytes bounds a path in a request (Linux's PATH_MAX).
const maxPathBytes = 4096

// MaxWatchesPerTenant bounds the watches (WatchDir streams and watchers) one tenant has
// open at once.
const MaxWatchesPerTenant = 64

// sandboxFilePath refuses a path that is not absolute, climbs with "..", holds a NUL or
// is too long. It is not cleaned: a path means what it says or is refused.
func sandboxFilePath(what, p string) (string, error) {
	switch {
	case p == "" || !strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("%w: %s %q is not absolute: give a path starting with /, e.g. /tmp/data.txt", roche.ErrInvalidConfig, what, p)
	case len(p) > maxPathBytes:
		return "", fmt.Errorf("%w: %s is %d bytes long, over %d", roche.ErrInvalidConfig, what, len(p), maxPathBytes)
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%w: %s holds a NUL byte", roche.ErrInvalidConfig, what)
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: %s %q climbs with \"..\": give the path it means without it", roche.ErrInvalidConfig, what, p)
		}
	}
	return p, nil
}

// fileSystem resolves a sandbox of the caller's whose provider has the files API.
func (d *Daemon) fileSystem(ctx context.Context, id string) (ledger.Target, roche.FileSystem, error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return ledger.Target{}, nil, err
	}
	t, err := d.ledger.Resolve(tn, id)
	if err != nil {
		return t, nil, err
	}
	fsys, ok := t.Provider.(roche.FileSystem)
	if !ok || !t.Provider.Capabilities().Files {
		return t, nil, fmt.Errorf("%w: the %s provider has no files API", roche.ErrUnsupported, t.Provider.Name())
	}
	return t, fsys, nil
}

// uncompressedFiles serves file content uncompressed, whatever the client accepts:
// connect-go gzips any message over WithCompressMinBytes for a client that accepts it
// (its own clients do by default), and gzip ran at some 50 MB/s here, a tenth of what a
// read otherwise moves, on content that is often compressed already.
func uncompressedFiles(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case rochev1connect.SandboxServiceReadFileProcedure, rochev1connect.SandboxServiceCopyFromProcedure:
			r.Header.Del("Connect-Accept-Encoding")
			r.Header.Del("Grpc-Accept-Encoding")
			r.Header.Del("Accept-Encoding")
		}
		next.ServeHTTP(w, r)
	})
}

// fileChunkSender sends what is written to it as ReadFile messages.
type fileChunkSender struct {
	stream *connect.ServerStream[rochev1.ReadFileResponse]
	left   int64
	path   string
	limit  int64
}

func (c *fileChunkSender) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, fmt.Errorf("%w: %s grew past the %s one read may move while it was read: read it again, or raise the cap (max_bytes)",
			roche.ErrExhausted, c.path, size.String(c.limit))
	}
	c.left -= int64(len(p))
	n := len(p)
	for len(p) > 0 {
		piece := p[:min(len(p), fileChunk)]
		p = p[len(piece):]
		if err := c.stream.Send(&rochev1.ReadFileResponse{Data: piece}); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func (s *service) ReadFile(ctx context.Context, req *connect.Request[rochev1.ReadFileRequest], stream *connect.ServerStream[rochev1.ReadFileResponse]) error {
	p, err := sandboxFilePath("path", req.Msg.Path)
	if err != nil {
		return wire.ToStatus(err)
	}
	limit, err := s.d.copyLimit(req.Msg.MaxBytes)
	if err != nil {
		return wire.ToStatus(err)
	}
	t, fsys, err := s.d.fileSystem(ctx, req.Msg.SandboxId)
	var sent int64
	if err == nil {
		err = func() error {
			fi, err := fsys.Stat(ctx, t.ID, p)
			if err != nil {
				return err
			}
			switch typ := fi.FileType(); {
			case typ == "dir":
				return fmt.Errorf("%w: %s is a directory: list it (ListDir), or copy it out as an archive (CopyFrom)", roche.ErrInvalidConfig, p)
			case typ == "symlink":
				return fmt.Errorf("%w: %s is a symlink: the files API does not follow symlinks", roche.ErrPermission, p)
			case typ != "file":
				return fmt.Errorf("%w: %s is a %s, not a regular file: the files API reads regular files only", roche.ErrInvalidConfig, p, typ)
			case fi.Size > limit:
				return fmt.Errorf("%w: %s is %s, over the %s one read may move: read less, or raise the cap (max_bytes, roched --copy-max-bytes)",
					roche.ErrExhausted, p, size.String(fi.Size), size.String(limit))
			}
			if err := stream.Send(&rochev1.ReadFileResponse{Entry: wire.FileEntryToProto(fi)}); err != nil {
				return err
			}
			cs := &fileChunkSender{stream: stream, left: limit, path: p, limit: limit}
			out := bufio.NewWriterSize(cs, fileChunk)
			if err := fsys.ReadFile(ctx, t.ID, p, out); err != nil {
				return err
			}
			if err := out.Flush(); err != nil {
				return err
			}
			sent = limit - cs.left
			return nil
		}()
	}
	s.d.audit(ctx, "read_file", err, "id", req.Msg.SandboxId, "path", p, "bytes", sent)
	return wire.ToStatus(err)
}

// fileUpload reads a WriteFile's content as its messages arrive, at most max bytes, and
// remembers its own failures (the cap, the client's stream) apart from the sandbox's.
type fileUpload struct {
	stream *connect.ClientStream[rochev1.WriteFileRequest]
	rest   []byte
	n, max int64
	path   string
	err    error // the client's side: the cap passed, or its stream failed
	eof    bool
}

func (u *fileUpload) Read(p []byte) (int, error) {
	for len(u.rest) == 0 {
		if u.err != nil {
			return 0, u.err
		}
		if u.eof {
			return 0, io.EOF
		}
		if !u.stream.Receive() {
			if err := u.stream.Err(); err != nil {
				u.err = fmt.Errorf("the upload of %s broke off: %w", u.path, err)
				continue
			}
			u.eof = true
			continue
		}
		u.rest = u.stream.Msg().Data
	}
	if u.n+int64(len(u.rest)) > u.max {
		u.err = fmt.Errorf("%w: the upload of %s is more than the %s one write may move: raise the cap (max_bytes, roched --copy-max-bytes)",
			roche.ErrExhausted, u.path, size.String(u.max))
		return 0, u.err
	}
	n := copy(p, u.rest)
	u.rest = u.rest[n:]
	u.n += int64(n)
	return n, nil
}

func (s *service) WriteFile(ctx context.Context, stream *connect.ClientStream[rochev1.WriteFileRequest]) (*connect.Response[rochev1.WriteFileResponse], error) {
	if !stream.Receive() {
		err := stream.Err()
		if err == nil {
			err = fmt.Errorf("%w: empty upload: the first message names sandbox_id and path", roche.ErrInvalidConfig)
		}
		return nil, wire.ToStatus(err)
	}
	first := stream.Msg()
	p, err := sandboxFilePath("path", first.Path)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	mode := fs.FileMode(first.Mode)
	switch {
	case mode == 0:
		mode = 0o644
	case mode&^fs.ModePerm != 0:
		return nil, wire.ToStatus(fmt.Errorf("%w: mode %o: give permission bits only (at most 0777)", roche.ErrInvalidConfig, first.Mode))
	}
	limit, err := s.d.copyLimit(first.MaxBytes)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	up := &fileUpload{stream: stream, rest: first.Data, max: limit, path: p}
	t, fsys, err := s.d.fileSystem(ctx, first.SandboxId)
	if err == nil {
		err = fsys.WriteFile(ctx, t.ID, p, up, mode)
		if up.err != nil {
			err = up.err // the client's side failed, not the sandbox
		}
	}
	s.d.audit(ctx, "write_file", err, "id", first.SandboxId, "path", p, "bytes", up.n)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	written := roche.FileInfo{Path: p, Size: up.n, Mode: mode, ModTime: time.Now()}
	if fi, err := fsys.Stat(ctx, t.ID, p); err == nil && fi.FileType() == "file" {
		written = fi // its owner and times, as the sandbox has them
	}
	return connect.NewResponse(&rochev1.WriteFileResponse{Entry: wire.FileEntryToProto(written)}), nil
}

func (s *service) ListDir(ctx context.Context, req *connect.Request[rochev1.ListDirRequest]) (*connect.Response[rochev1.ListDirResponse], error) {
	p, err := sandboxFilePath("path", req.Msg.Path)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	depth, err := kit.ListDepth(int(min(req.Msg.Depth, roche.MaxListDepth+1)))
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, fsys, err := s.d.fileSystem(ctx, req.Msg.SandboxId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	out := &rochev1.ListDirResponse{Entries: []*rochev1.FileEntry{}}
	add := func(fi roche.FileInfo) error {
		out.Entries = append(out.Entries, wire.FileEntryToProto(fi))
		return nil
	}
	if dw, ok := t.Provider.(roche.DirWalker); ok {
		err = dw.WalkDir(ctx, t.ID, p, depth, roche.MaxListEntries, add)
	} else if depth == 1 {
		var list []roche.FileInfo
		if list, err = fsys.ListDir(ctx, t.ID, p); err == nil {
			for _, fi := range list {
				_ = add(fi)
			}
		}
	} else {
		err = fmt.Errorf("%w: the %s provider lists one level at a time: give depth 1", roche.ErrUnsupported, t.Provider.Name())
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(out), nil
}

func (s *service) Stat(ctx context.Context, req *connect.Request[rochev1.StatRequest]) (*connect.Response[rochev1.StatResponse], error) {
	p, err := sandboxFilePath("path", req.Msg.Path)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, fsys, err := s.d.fileSystem(ctx, req.Msg.SandboxId)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	fi, err := fsys.Stat(ctx, t.ID, p)
	if err != nil {
		if req.Msg.MissingOk && errors.Is(err, roche.ErrNotFound) && !s.d.gone(ctx, req.Msg.SandboxId) {
			return connect.NewResponse(&rochev1.StatResponse{Exists: false}), nil
		}
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.StatResponse{Entry: wire.FileEntryToProto(fi), Exists: true}), nil
}

// gone reports whether the caller's sandbox id is no longer served (so that a missing
// path is not mistaken for a missing sandbox).
func (d *Daemon) gone(ctx context.Context, id string) bool {
	tn, err := tenantOf(ctx)
	if err != nil {
		return true
	}
	_, err = d.ledger.Resolve(tn, id)
	return err != nil
}

func (s *service) MakeDir(ctx context.Context, req *connect.Request[rochev1.MakeDirRequest]) (*connect.Response[rochev1.MakeDirResponse], error) {
	p, err := sandboxFilePath("path", req.Msg.Path)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, fsys, err := s.d.fileSystem(ctx, req.Msg.SandboxId)
	created := false
	var fi roche.FileInfo
	if err == nil {
		fi, err = fsys.Stat(ctx, t.ID, p)
		switch {
		case err == nil && !fi.Mode.IsDir():
			err = fmt.Errorf("%w: %s exists and is not a directory", roche.ErrInvalidConfig, p)
		case errors.Is(err, roche.ErrNotFound):
			if err = fsys.Mkdir(ctx, t.ID, p); err == nil {
				created = true
				fi, err = fsys.Stat(ctx, t.ID, p)
			}
		}
	}
	if created || err != nil {
		s.d.audit(ctx, "make_dir", err, "id", req.Msg.SandboxId, "path", p)
	}
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.MakeDirResponse{Entry: wire.FileEntryToProto(fi), Created: created}), nil
}

func (s *service) Rename(ctx context.Context, req *connect.Request[rochev1.RenameRequest]) (*connect.Response[rochev1.RenameResponse], error) {
	from, err := sandboxFilePath("source", req.Msg.Source)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	to, err := sandboxFilePath("destination", req.Msg.Destination)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, fsys, err := s.d.fileSystem(ctx, req.Msg.SandboxId)
	var fi roche.FileInfo
	if err == nil {
		if err = fsys.Rename(ctx, t.ID, from, to); err == nil {
			fi, err = fsys.Stat(ctx, t.ID, to)
		}
	}
	s.d.audit(ctx, "rename", err, "id", req.Msg.SandboxId, "from", from, "to", to)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.RenameResponse{Entry: wire.FileEntryToProto(fi)}), nil
}

func (s *service) Remove(ctx context.Context, req *connect.Request[rochev1.RemoveRequest]) (*connect.Response[rochev1.RemoveResponse], error) {
	p, err := sandboxFilePath("path", req.Msg.Path)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, fsys, err := s.d.fileSystem(ctx, req.Msg.SandboxId)
	if err == nil {
		err = fsys.Remove(ctx, t.ID, p)
	}
	s.d.audit(ctx, "remove", err, "id", req.Msg.SandboxId, "path", p)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.RemoveResponse{}), nil
}

// dirWatcher resolves a sandbox of the caller's whose provider watches directories, and
// takes one of the tenant's watches; release gives it back.
func (d *Daemon) dirWatcher(ctx context.Context, id string) (t ledger.Target, dw roche.DirWatcher, release func(), err error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return t, nil, nil, err
	}
	t, err = d.ledger.Resolve(tn, id)
	if err != nil {
		return t, nil, nil, err
	}
	dw, ok := t.Provider.(roche.DirWatcher)
	if !ok || !t.Provider.Capabilities().Files {
		return t, nil, nil, fmt.Errorf("%w: the %s provider cannot watch directories", roche.ErrUnsupported, t.Provider.Name())
	}
	release, err = d.watches.take(tn.Name)
	return t, dw, release, err
}

func (s *service) WatchDir(ctx context.Context, req *connect.Request[rochev1.WatchDirRequest], stream *connect.ServerStream[rochev1.WatchDirResponse]) error {
	p, err := sandboxFilePath("path", req.Msg.Path)
	if err != nil {
		return wire.ToStatus(err)
	}
	t, dw, release, err := s.d.dirWatcher(ctx, req.Msg.SandboxId)
	if err != nil {
		s.d.audit(ctx, "watch_dir", err, "id", req.Msg.SandboxId, "path", p)
		return wire.ToStatus(err)
	}
	defer release()
	// The call ends with roched's shutdown, as a Hold does, so that it does not hold it up.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.d.draining:
			cancel()
		case <-ctx.Done():
		}
	}()
	sender := newSender(stream)
	stopBeats := func() {}
	opts := roche.WatchOptions{Recursive: req.Msg.Recursive, Started: func() {
		_ = sender.send(&rochev1.WatchDirResponse{Event: &rochev1.WatchDirResponse_Started{Started: &rochev1.WatchStarted{}}})
		stopBeats = sender.heartbeats(s.d.cfg.HeartbeatInterval, func(now time.Time) *rochev1.WatchDirResponse {
			return &rochev1.WatchDirResponse{Event: &rochev1.WatchDirResponse_Heartbeat{Heartbeat: &rochev1.Heartbeat{Time: timestamppb.New(now)}}}
		})
	}}
	err = dw.WatchDir(ctx, t.ID, p, opts, func(ev roche.FileEvent) error {
		return sender.send(&rochev1.WatchDirResponse{Event: &rochev1.WatchDirResponse_File{File: wire.FileEventToProto(ev)}})
	})
	stopBeats()
	sender.close()
	s.d.audit(ctx, "watch_dir", err, "id", t.ID, "path", p, "recursive", req.Msg.Recursive)
	return wire.ToStatus(err)
}
