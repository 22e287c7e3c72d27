package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/internal/tarfs"
	"github.com/roche-sandbox/roche/internal/wire"
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
	_ roche.FileCopier       = (*Provider)(nil)
	_ roche.Pauser           = (*Provider)(nil)
	_ roche.GarbageCollector = (*Provider)(nil)
	_ roche.Resetter         = (*Provider)(nil)
	_ roche.WorkspaceManager = (*Provider)(nil)
	_ roche.Snapshotter      = (*Provider)(nil)
)

// Provider returns the daemon's provider called name ("docker", "wasm", ...).
func (c *Client) Provider(name string) *Provider { return &Provider{c: c, name: name} }

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
				roche.ErrInvalidConfig, roche.SizeString(roche.MaxStdinBytes))
		}
		stdin = b
		if stdin == nil {
			stdin = []byte{} // present but empty: the command sees EOF at once
		}
	}
	if req.Stdout == nil && req.Stderr == nil && req.OutputLimit <= wire.MaxExecOutput {
		resp, err := p.c.rpc.Exec(ctx, connect.NewRequest(wire.ExecToProto(id, req, stdin)))
		if err != nil {
			return roche.ExecResult{}, p.c.fromRPC(err)
		}
		return wire.ResultFromProto(resp.Msg.Result), nil
	}

	stream, err := p.c.rpc.ExecStream(ctx, connect.NewRequest(wire.ExecStreamToProto(id, req, stdin)))
	if err != nil {
		return roche.ExecResult{}, p.c.fromRPC(err)
	}
	defer stream.Close()
	stdout, stderr := req.Captures()
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
		return roche.ExecResult{}, p.c.fromRPC(err)
	}
	if result == nil {
		return roche.ExecResult{}, fmt.Errorf("%w: the daemon ended the output stream without a result", roche.ErrUnavailable)
	}
	res := wire.ResultFromProto(result)
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	res.Truncated = res.Truncated || stdout.Truncated() || stderr.Truncated()
	return res, nil
}

// Destroy implements roche.Provider: idempotent, as in-process.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	_, err := p.c.rpc.Destroy(ctx, connect.NewRequest(&rochev1.DestroyRequest{Ids: []string{id}, Provider: p.name}))
	return p.c.fromRPC(err)
}

// Inspect implements roche.Provider.
func (p *Provider) Inspect(ctx context.Context, id string) (roche.SandboxInfo, error) {
	resp, err := p.c.rpc.Inspect(ctx, connect.NewRequest(&rochev1.InspectRequest{SandboxId: id}))
	if err != nil {
		return roche.SandboxInfo{}, p.c.fromRPC(err)
	}
	return wire.InfoFromProto(resp.Msg.Sandbox), nil
}

// List implements roche.Provider: this provider's sandboxes handed to clients (a
// pool's idle sandboxes are not listed).
func (p *Provider) List(ctx context.Context) ([]roche.SandboxInfo, error) {
	resp, err := p.c.rpc.List(ctx, connect.NewRequest(&rochev1.ListRequest{Provider: p.name}))
	if err != nil {
		return nil, p.c.fromRPC(err)
	}
	out := make([]roche.SandboxInfo, 0, len(resp.Msg.Sandboxes))
	for _, sb := range resp.Msg.Sandboxes {
		out = append(out, wire.InfoFromProto(sb))
	}
	return out, nil
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
	return out, nil
}

// copyChunk is the size of each uploaded piece of the tar stream.
const copyChunk = 32 << 10

// CopyTo implements roche.FileCopier: the host path src (on the client's host) is sent
// as a tar stream and becomes dst in the sandbox.
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	if _, err := os.Lstat(src); err != nil {
		return fmt.Errorf("%w: host path %s: %v", roche.ErrNotFound, src, err)
	}
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return fmt.Errorf("%w: destination %q must be an absolute path below /", roche.ErrInvalidConfig, dst)
	}
	stream := p.c.rpc.CopyTo(ctx)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarfs.Write(pw, src, path.Base(path.Clean(dst)))) }()
	defer pr.Close()
	first := true
	buf := make([]byte, copyChunk)
	for {
		n, rerr := io.ReadFull(pr, buf)
		if n > 0 || first {
			msg := &rochev1.CopyToRequest{TarChunk: buf[:n]}
			if first {
				msg.SandboxId, msg.Dst, first = id, dst, false
			}
			if err := stream.Send(msg); err != nil {
				// The daemon refused (unknown sandbox, ...): its reason comes with the close.
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
			return fmt.Errorf("packing %s: %w", src, rerr)
		}
	}
	_, err := stream.CloseAndReceive()
	return p.c.fromRPC(err)
}

// CopyFrom implements roche.FileCopier: the sandbox path src becomes the host path dst
// (on the client's host).
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	stream, err := p.c.rpc.CopyFrom(ctx, connect.NewRequest(&rochev1.CopyFromRequest{SandboxId: id, Src: src}))
	if err != nil {
		return p.c.fromRPC(err)
	}
	defer stream.Close()
	pr, pw := io.Pipe()
	extracted := make(chan error, 1)
	go func() {
		err := tarfs.Extract(pr, dst)
		_, _ = io.Copy(io.Discard, pr)
		extracted <- err
	}()
	for stream.Receive() {
		if _, err := pw.Write(stream.Msg().TarChunk); err != nil {
			break
		}
	}
	serr := stream.Err()
	pw.Close()
	xerr := <-extracted
	if serr != nil {
		return p.c.fromRPC(serr)
	}
	if xerr != nil {
		return fmt.Errorf("copying %s out of sandbox %s: %w", src, id, xerr)
	}
	return nil
}
