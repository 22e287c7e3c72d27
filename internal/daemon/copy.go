package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"path"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/ledger"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/tarfs"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Copies are relayed, never staged: the tar stream goes between the client and the
// provider (roche.TarCopier) as it comes, through tarfs.Filter, which checks every
// entry and enforces the size cap before the content that would pass it is sent on. So
// a sandbox's 10 TiB sparse file costs the daemon's host neither disk nor memory.

// tarCopier resolves a sandbox of the caller's whose provider copies files.
func (d *Daemon) tarCopier(ctx context.Context, id string) (ledger.Target, roche.TarCopier, error) {
	tn, err := tenantOf(ctx)
	if err != nil {
		return ledger.Target{}, nil, err
	}
	t, err := d.ledger.Resolve(tn, id)
	if err != nil {
		return t, nil, err
	}
	tc, ok := t.Provider.(roche.TarCopier)
	if !ok {
		return t, nil, fmt.Errorf("%w: the %s provider cannot copy files", roche.ErrUnsupported, t.Provider.Name())
	}
	return t, tc, nil
}

// copyLimit is the cap of one copy: the daemon's, or less when the request asks for less.
func (d *Daemon) copyLimit(asked int64) (int64, error) {
	switch {
	case asked < 0:
		return 0, fmt.Errorf("%w: max_bytes %d: give a positive size, or 0 for the daemon's cap", roche.ErrInvalidConfig, asked)
	case asked == 0:
		return d.cfg.CopyMaxBytes, nil
	case asked > d.cfg.CopyMaxBytes:
		return 0, fmt.Errorf("%w: max_bytes %s is over this roched's cap of %s per copy (roched --copy-max-bytes)",
			roche.ErrInvalidConfig, size.String(asked), size.String(d.cfg.CopyMaxBytes))
	}
	return asked, nil
}

// copyErr gives an error of roched's side of a copy (checking the stream) its sentinel,
// as roche.CopyIn and CopyOut do theirs.
var copyErr = tarfs.Sentinels{Exhausted: roche.ErrExhausted, Permission: roche.ErrPermission, Invalid: roche.ErrInvalidConfig, NotFound: roche.ErrNotFound}

// uploadReader reads the tar stream of a CopyTo request as its messages arrive. It is
// read only from within the handler's call (tarfs.PipeTo waits for its reader), so the
// stream is never touched after the handler returns.
type uploadReader struct {
	stream *connect.ClientStream[rochev1.CopyToRequest]
	rest   []byte
	err    error
}

func (u *uploadReader) Read(p []byte) (int, error) {
	for len(u.rest) == 0 {
		if u.err != nil {
			return 0, u.err
		}
		if !u.stream.Receive() {
			u.err = u.stream.Err()
			if u.err == nil {
				u.err = io.EOF
			}
			continue
		}
		u.rest = u.stream.Msg().TarChunk
	}
	n := copy(p, u.rest)
	u.rest = u.rest[n:]
	return n, nil
}

// CopyTo relays the uploaded tar stream into the sandbox: its root entry becomes dst.
func (s *service) CopyTo(ctx context.Context, stream *connect.ClientStream[rochev1.CopyToRequest]) (*connect.Response[rochev1.CopyToResponse], error) {
	if !stream.Receive() {
		err := stream.Err()
		if err == nil {
			err = fmt.Errorf("%w: empty upload: the first message names sandbox_id and dst", roche.ErrInvalidConfig)
		}
		return nil, wire.ToStatus(err)
	}
	first := stream.Msg()
	id, dst := first.SandboxId, first.Dst
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return nil, wire.ToStatus(fmt.Errorf("%w: destination %q must be an absolute path below /", roche.ErrInvalidConfig, dst))
	}
	dst = path.Clean(dst)
	limit, err := s.d.copyLimit(first.MaxBytes)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	t, tc, err := s.d.tarCopier(ctx, id)
	if err != nil {
		s.d.audit(ctx, "copy_to", err, "id", id, "dst", dst)
		return nil, wire.ToStatus(err)
	}
	upload := &uploadReader{stream: stream, rest: first.TarChunk}
	var ferr error
	err = tarfs.PipeTo(ctx, tc, t.ID, dst, func(w io.Writer) error {
		// In the sandbox, links reach nothing its user could not: they are kept.
		_, ferr = tarfs.Filter(upload, w, path.Base(dst), tarfs.Options{MaxBytes: limit, Links: tarfs.AllLinks})
		if ferr == nil {
			// The end of the stream (padding), so the client's last sends succeed; bounded.
			_, _ = io.CopyN(io.Discard, upload, 1<<20)
		}
		return ferr
	})
	if err != nil {
		switch {
		case ferr != nil && errors.Is(err, tarfs.ErrMalformed):
			// What the client sent is not a tar stream: its error, not roched's.
			err = fmt.Errorf("%w: copying into sandbox %s at %s: the upload: %v: send a tar stream", roche.ErrInvalidConfig, id, dst, err)
		case ferr != nil && errors.Is(err, ferr):
			err = copyErr.Wrap(fmt.Sprintf("copying into sandbox %s at %s: the upload", id, dst), err)
		}
	}
	s.d.audit(ctx, "copy_to", err, "id", t.ID, "dst", dst)
	if err != nil {
		return nil, wire.ToStatus(err)
	}
	return connect.NewResponse(&rochev1.CopyToResponse{}), nil
}

// chunkSender sends what is written to it as CopyFrom messages of at most maxChunk.
type chunkSender struct {
	stream *connect.ServerStream[rochev1.CopyFromResponse]
}

func (c chunkSender) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		piece := p[:min(len(p), maxChunk)]
		p = p[len(piece):]
		if err := c.stream.Send(&rochev1.CopyFromResponse{TarChunk: piece}); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// CopyFrom relays src out of the sandbox as a checked tar stream; what it leaves out is
// counted in the response trailer (wire.SetSkipped).
func (s *service) CopyFrom(ctx context.Context, req *connect.Request[rochev1.CopyFromRequest], stream *connect.ServerStream[rochev1.CopyFromResponse]) error {
	src := req.Msg.Src
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return wire.ToStatus(fmt.Errorf("%w: source %q must be an absolute path below /", roche.ErrInvalidConfig, src))
	}
	src = path.Clean(src)
	limit, err := s.d.copyLimit(req.Msg.MaxBytes)
	if err != nil {
		return wire.ToStatus(err)
	}
	t, tc, err := s.d.tarCopier(ctx, req.Msg.SandboxId)
	if err != nil {
		s.d.audit(ctx, "copy_from", err, "id", req.Msg.SandboxId, "src", src)
		return wire.ToStatus(err)
	}
	links := tarfs.SkipLinks
	if req.Msg.PreserveLinks {
		links = tarfs.InsideLinks
	}
	var rep tarfs.Report
	var ferr error
	err = tarfs.PipeFrom(ctx, tc, t.ID, src, func(r io.Reader) error {
		out := bufio.NewWriterSize(chunkSender{stream}, maxChunk)
		rep, ferr = tarfs.Filter(r, out, "", tarfs.Options{MaxBytes: limit, Links: links})
		if ferr == nil {
			ferr = out.Flush()
		}
		return ferr
	})
	wire.SetSkipped(stream.ResponseTrailer(), skippedReport(rep, path.Dir(src)))
	if err != nil {
		if ferr != nil && errors.Is(err, ferr) {
			var le *tarfs.LimitError
			if errors.As(err, &le) {
				le.Name = path.Join(path.Dir(src), le.Name)
			}
			err = copyErr.Wrap(fmt.Sprintf("copying %s out of sandbox %s", src, req.Msg.SandboxId), err)
		}
	}
	s.d.audit(ctx, "copy_from", err, "id", t.ID, "src", src)
	return wire.ToStatus(err)
}

// skippedReport is what rep left out, with archive names made sandbox paths below dir.
func skippedReport(rep tarfs.Report, dir string) roche.CopyReport {
	out := roche.CopyReport{Skipped: rep.Skipped, SkippedLinks: rep.SkippedLinks}
	for _, e := range rep.Examples {
		out.Examples = append(out.Examples, roche.SkippedEntry{Path: path.Join(dir, e.Name), Target: e.Linkname, Reason: e.Reason})
	}
	return out
}
