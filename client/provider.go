package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/tarfs"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Provider is one of the daemon's providers seen through the API. It implements
// roche.Provider, FileCopier, Pauser, GarbageCollector, Resetter, WorkspaceManager and
// Snapshotter; a provider of the daemon that lacks one of these answers ErrUnsupported.
type Provider struct {
	c    *Client
	name string
}

var (
	_ roche.Provider         = (*Provider)(nil)
	_ kit.Creator            = (*Provider)(nil)
	_ roche.FileCopier       = (*Provider)(nil)
	_ roche.TarCopier        = (*Provider)(nil)
	_ kit.Copier             = (*Provider)(nil)
	_ roche.Pauser           = (*Provider)(nil)
	_ roche.GarbageCollector = (*Provider)(nil)
	_ roche.Resetter         = (*Provider)(nil)
	_ roche.WorkspaceManager = (*Provider)(nil)
	_ roche.Snapshotter      = (*Provider)(nil)
)

// Provider returns the daemon's provider called name ("docker", "wasm", ...).
func (c *Client) Provider(name string) *Provider { return &Provider{c: c, name: name} }

// Client is the client the provider calls through (for the daemon's own calls, such as
// its watchers).
func (p *Provider) Client() *Client { return p.c }

// Name implements roche.Provider.
func (p *Provider) Name() string { return p.name }

// Capabilities implements roche.Provider, asking the daemon once. When the daemon cannot
// be asked it reports nothing supported, which makes callers refuse rather than assume.
func (p *Provider) Capabilities() roche.Capabilities {
	p.c.mu.Lock()
	caps, ok := p.c.caps[p.name]
	p.c.mu.Unlock()
	if ok {
		return caps
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := p.c.Providers(ctx)
	if err != nil {
		return roche.Capabilities{}
	}
	for _, pi := range list {
		if pi.Name == p.name {
			return pi.Capabilities
		}
	}
	return roche.Capabilities{}
}

// Create implements roche.Provider.
func (p *Provider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	sb, _, err := p.c.Create(ctx, p.name, cfg)
	return sb, err
}

// CreateFor implements kit.Creator (see Client.CreateFor: roched names the owner).
func (p *Provider) CreateFor(ctx context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	sb, _, err := p.c.CreateFor(ctx, p.name, cfg, opts)
	return sb, err
}

// Exec implements roche.Provider. With req.Stdout or req.Stderr set, or an output limit
// over what a unary Exec carries (wire.MaxExecOutput), it streams the output as the
// command produces it (ExecStream); otherwise one round trip (Exec). Stdin is read to
// its end first and sent whole (at most roche.MaxStdinBytes), so it suits piped input,
// not a conversation with the command.
func (p *Provider) Exec(ctx context.Context, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	if err := req.Validate(); err != nil {
		return roche.ExecResult{}, err
	}
	var stdin []byte
	if req.Stdin != nil {
		b, err := io.ReadAll(io.LimitReader(req.Stdin, roche.MaxStdinBytes+1))
		if err != nil {
			return roche.ExecResult{}, fmt.Errorf("reading stdin for the command: %w", err)
		}
		if len(b) > roche.MaxStdinBytes {
			return roche.ExecResult{}, fmt.Errorf("%w: stdin is over the limit of %s: copy large input in as a file (roche cp) instead",
				roche.ErrInvalidConfig, size.String(roche.MaxStdinBytes))
		}
		stdin = b
		if stdin == nil {
			stdin = []byte{} // present but empty: the command sees EOF at once
		}
	}
	if req.Stdout == nil && req.Stderr == nil && req.OutputLimit <= wire.MaxExecOutput {
		exec := func(bool) (*connect.Response[rochev1.ExecResponse], error) {
			return p.c.rpc.Exec(ctx, connect.NewRequest(wire.ExecToProto(id, req, stdin)))
		}
		var resp *connect.Response[rochev1.ExecResponse]
		var err error
		if req.IdempotencyKey != "" {
			// Safe to repeat: a retry joins the command the first attempt started.
			resp, err = retrying(ctx, p.c, exec)
		} else {
			resp, err = exec(false)
		}
		if err != nil {
			return roche.ExecResult{}, p.c.lostDuringCommand(err, id, req.IdempotencyKey)
		}
		return wire.ResultFromProto(resp.Msg.Result), nil
	}

	stream, err := p.c.rpc.ExecStream(ctx, connect.NewRequest(wire.ExecStreamToProto(id, req, stdin)))
	if err != nil {
		return roche.ExecResult{}, p.c.fromRPC(err)
	}
	defer stream.Close()
	stdout, stderr := kit.Captures(req)
	var result *rochev1.ExecResult
	for stream.Receive() {
		switch ev := stream.Msg().Event.(type) {
		case *rochev1.ExecStreamResponse_Output:
			if ev.Output.Stream == rochev1.OutputStream_OUTPUT_STREAM_STDERR {
				stderr.Write(ev.Output.Data)
			} else {
				stdout.Write(ev.Output.Data)
			}
		case *rochev1.ExecStreamResponse_Result:
			result = ev.Result
		}
	}
	if err := stream.Err(); err != nil {
		return roche.ExecResult{}, p.c.lostDuringCommand(err, id, req.IdempotencyKey)
	}
	if result == nil {
		return roche.ExecResult{}, fmt.Errorf("%w: the daemon ended the output stream without a result", roche.ErrUnavailable)
	}
	res := wire.ResultFromProto(result)
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	res.Truncated = res.Truncated || stdout.Truncated() || stderr.Truncated()
	return res, nil
}

// Destroy implements roche.Provider: idempotent, as in-process. roched answers
// NOT_FOUND for an id that names none of the caller's sandboxes (already destroyed,
// never made, or another tenant's), which for Destroy means there is nothing to do.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	defer p.c.release(id)
	// A destroy is safe to repeat: one that finds nothing after a lost connection
	// found it destroyed by the attempt before.
	_, err := retrying(ctx, p.c, func(bool) (*connect.Response[rochev1.DestroyResponse], error) {
		return p.c.rpc.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{id}, Provider: p.name}))
	})
	if err = p.c.fromRPC(err); errors.Is(err, roche.ErrNotFound) {
		return nil
	}
	return err
}

// Inspect implements roche.Provider.
func (p *Provider) Inspect(ctx context.Context, id string) (roche.SandboxInfo, error) {
	resp, err := retrying(ctx, p.c, func(bool) (*connect.Response[rochev1.InspectResponse], error) {
		return p.c.rpc.Inspect(ctx, connect.NewRequest(&rochev1.InspectRequest{SandboxId: id}))
	})
	if err != nil {
		return roche.SandboxInfo{}, p.c.fromRPC(err)
	}
	return wire.InfoFromProto(resp.Msg.Sandbox), nil
}

// InspectEnded implements roche.EndInspector: Inspect, and of a sandbox that ended
// within roched's --ended-retention, its last description (state exited) with End
// saying why it ended.
func (p *Provider) InspectEnded(ctx context.Context, id string) (roche.SandboxInfo, error) {
	resp, err := p.c.rpc.Inspect(ctx, connect.NewRequest(&rochev1.InspectRequest{SandboxId: id, IncludeEnded: true}))
	if err != nil {
		return roche.SandboxInfo{}, p.c.fromRPC(err)
	}
	return wire.InfoFromProto(resp.Msg.Sandbox), nil
}

// List implements roche.Provider: this provider's sandboxes handed to clients (a
// pool's idle sandboxes are not listed).
func (p *Provider) List(ctx context.Context) ([]roche.SandboxInfo, error) {
	return p.ListFiltered(ctx, roche.ListFilter{})
}

// ListFiltered is List of the sandboxes filter keeps (roched filters them).
func (p *Provider) ListFiltered(ctx context.Context, filter roche.ListFilter) ([]roche.SandboxInfo, error) {
	if err := filter.Validate(); err != nil {
		return nil, err
	}
	resp, err := retrying(ctx, p.c, func(bool) (*connect.Response[rochev1.ListResponse], error) {
		return p.c.rpc.List(ctx, connect.NewRequest(wire.FilterToProto(p.name, filter)))
	})
	if err != nil {
		return nil, p.c.fromRPC(err)
	}
	out := make([]roche.SandboxInfo, 0, len(resp.Msg.Sandboxes))
	for _, sb := range resp.Msg.Sandboxes {
		out = append(out, wire.InfoFromProto(sb))
	}
	return out, wire.SkippedFromProto(resp.Msg.Skipped)
}

var _ roche.LifetimeSetter = (*Provider)(nil)

// SetTimeout implements roche.LifetimeSetter: roched makes the sandbox end d from now,
// within the tenant's maximum lifetime, and answers with its new expires_at. d is
// checked as every provider checks it (under 1 s is refused, not rounded up to it), then
// rounded up to whole seconds for the wire.
func (p *Provider) SetTimeout(ctx context.Context, id string, d time.Duration) (roche.SandboxInfo, error) {
	if err := roche.ValidTimeout(d); err != nil {
		return roche.SandboxInfo{}, err
	}
	// Within 1 s and the whole-second maximum, rounded up it stays within them.
	secs := int64(math.Ceil(d.Seconds()))
	resp, err := p.c.rpc.SetTimeout(ctx, connect.NewRequest(&rochev1.SetTimeoutRequest{SandboxId: id, TimeoutSecs: int32(secs)}))
	if err != nil {
		return roche.SandboxInfo{}, p.c.fromRPC(err)
	}
	return wire.InfoFromProto(resp.Msg.Sandbox), nil
}

// Pause implements roche.Pauser.
func (p *Provider) Pause(ctx context.Context, id string) error {
	_, err := p.c.rpc.Pause(ctx, connect.NewRequest(&rochev1.PauseRequest{SandboxId: id}))
	return p.c.fromRPC(err)
}

// Unpause implements roche.Pauser.
func (p *Provider) Unpause(ctx context.Context, id string) error {
	_, err := p.c.rpc.Unpause(ctx, connect.NewRequest(&rochev1.UnpauseRequest{SandboxId: id}))
	return p.c.fromRPC(err)
}

// GC implements roche.GarbageCollector.
func (p *Provider) GC(ctx context.Context, opts roche.GCOptions) ([]roche.SandboxInfo, error) {
	resp, err := p.c.rpc.Gc(ctx, connect.NewRequest(&rochev1.GcRequest{All: opts.All, DryRun: opts.DryRun, Provider: p.name}))
	if err != nil {
		return nil, p.c.fromRPC(err)
	}
	out := make([]roche.SandboxInfo, 0, len(resp.Msg.Removed))
	for _, sb := range resp.Msg.Removed {
		out = append(out, wire.InfoFromProto(sb))
	}
	return out, wire.SkippedFromProto(resp.Msg.Skipped)
}

// copyChunk is the size of each uploaded piece of the tar stream.
const copyChunk = 32 << 10

// CopyTo implements roche.FileCopier with the default options (see CopyIn).
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	_, err := p.CopyIn(ctx, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyFrom implements roche.FileCopier with the default options (see CopyOut).
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	_, err := p.CopyOut(ctx, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyIn implements kit.Copier: roche.CopyIn, with the options also sent to the
// daemon, which enforces its own cap (roched --copy-max-bytes) as well.
func (p *Provider) CopyIn(ctx context.Context, id, src, dst string, opts roche.CopyOptions) (roche.CopyReport, error) {
	return roche.CopyIn(ctx, &optionCopier{p: p, opts: opts}, id, src, dst, opts)
}

// CopyOut implements kit.Copier: roche.CopyOut on the client's host, of a stream the
// daemon has already checked (names, size cap, links as asked); what the daemon left
// out is counted in the report with what the client did.
func (p *Provider) CopyOut(ctx context.Context, id, src, dst string, opts roche.CopyOptions) (roche.CopyReport, error) {
	oc := &optionCopier{p: p, opts: opts}
	rep, err := roche.CopyOut(ctx, oc, id, src, dst, opts)
	if errors.Is(err, tarfs.ErrEmpty) && oc.skipped.Skipped > 0 {
		err = nil // everything there was, the daemon left out (a symlink, say): the report says so
	}
	rep.Skipped += oc.skipped.Skipped
	rep.SkippedLinks += oc.skipped.SkippedLinks
	rep.Examples = append(oc.skipped.Examples, rep.Examples...)
	if len(rep.Examples) > 5 {
		rep.Examples = rep.Examples[:5]
	}
	return rep, err
}

// CopyTarTo implements roche.TarCopier: r is uploaded as it is read, under the daemon's cap.
func (p *Provider) CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error {
	return p.upload(ctx, id, dst, r, 0)
}

// CopyTarFrom implements roche.TarCopier: the daemon's checked stream, under its cap,
// without symlinks.
func (p *Provider) CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error {
	_, err := p.download(ctx, &rochev1.CopyFromRequest{SandboxId: id, Src: src}, w)
	return err
}

// optionCopier is the daemon's TarCopier for one copy with options: they go in the
// requests, and what the daemon left out is kept.
type optionCopier struct {
	p       *Provider
	opts    roche.CopyOptions
	skipped roche.CopyReport
}

func (o *optionCopier) CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error {
	return o.p.upload(ctx, id, dst, r, o.opts.MaxBytes)
}

func (o *optionCopier) CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error {
	rep, err := o.p.download(ctx, &rochev1.CopyFromRequest{
		SandboxId: id, Src: src, MaxBytes: max(o.opts.MaxBytes, 0), PreserveLinks: o.opts.PreserveLinks,
	}, w)
	o.skipped = rep
	return err
}

// upload sends the tar stream r to the daemon's CopyTo as it is read. maxBytes 0 leaves
// the cap to the daemon.
func (p *Provider) upload(ctx context.Context, id, dst string, r io.Reader, maxBytes int64) error {
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return fmt.Errorf("%w: destination %q must be an absolute path below /", roche.ErrInvalidConfig, dst)
	}
	stream := p.c.rpc.CopyTo(ctx)
	first := true
	buf := make([]byte, copyChunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 || first {
			msg := &rochev1.CopyToRequest{TarChunk: buf[:n]}
			if first {
				msg.SandboxId, msg.Dst, msg.MaxBytes, first = id, dst, max(maxBytes, 0), false
			}
			if err := stream.Send(msg); err != nil {
				// The daemon refused (unknown sandbox, over the cap, ...): its reason comes with the close.
				_, cerr := stream.CloseAndReceive()
				if cerr != nil {
					return p.c.fromRPC(cerr)
				}
				return p.c.fromRPC(err)
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			_, _ = stream.CloseAndReceive()
			return rerr
		}
	}
	_, err := stream.CloseAndReceive()
	return p.c.fromRPC(err)
}

// download writes the daemon's CopyFrom stream for req to w and returns what the daemon
// says it left out.
func (p *Provider) download(ctx context.Context, req *rochev1.CopyFromRequest, w io.Writer) (roche.CopyReport, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.c.rpc.CopyFrom(ctx, connect.NewRequest(req))
	if err != nil {
		return roche.CopyReport{}, p.c.fromRPC(err)
	}
	defer stream.Close()
	for stream.Receive() {
		if _, err := w.Write(stream.Msg().TarChunk); err != nil {
			// The reader gave up (a cap, a refusal): the rest of the stream is of no use.
			cancel()
			return roche.CopyReport{}, err
		}
	}
	if err := stream.Err(); err != nil {
		return roche.CopyReport{}, p.c.fromRPC(err)
	}
	return wire.Skipped(stream.ResponseTrailer()), nil
}

var _ roche.MemorySnapshotter = (*Provider)(nil)

// PauseToDisk implements roche.MemorySnapshotter.
func (p *Provider) PauseToDisk(ctx context.Context, id string) error {
	_, err := p.c.rpc.Pause(ctx, connect.NewRequest(&rochev1.PauseRequest{SandboxId: id, ToDisk: true}))
	return p.c.fromRPC(err)
}

// Resume implements roche.MemorySnapshotter.
func (p *Provider) Resume(ctx context.Context, id string) (roche.SandboxInfo, error) {
	resp, err := p.c.rpc.Resume(ctx, connect.NewRequest(&rochev1.ResumeRequest{SandboxId: id}))
	if err != nil {
		return roche.SandboxInfo{}, p.c.fromRPC(err)
	}
	return wire.InfoFromProto(resp.Msg.Sandbox), nil
}

// Fork implements roche.MemorySnapshotter.
func (p *Provider) Fork(ctx context.Context, id string, n int) ([]roche.SandboxInfo, error) {
	if n < 1 || n > roche.MaxForks {
		return nil, fmt.Errorf("%w: fork count %d: give 1 to %d", roche.ErrInvalidConfig, n, roche.MaxForks)
	}
	resp, err := p.c.rpc.Fork(ctx, connect.NewRequest(&rochev1.ForkRequest{SandboxId: id, Count: int32(n)}))
	if err != nil {
		return nil, p.c.fromRPC(err)
	}
	out := make([]roche.SandboxInfo, 0, len(resp.Msg.Sandboxes))
	for _, sb := range resp.Msg.Sandboxes {
		out = append(out, wire.InfoFromProto(sb))
	}
	return out, nil
}
