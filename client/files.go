package client

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
)

// WriteFile writes r to the absolute sandbox path, replacing it and creating missing
// parents, as roche.FileSystem's WriteFile does in-process. The daemon's API moves files
// as tar streams (CopyTo), so the content is staged in a temporary file first, which
// gives the tar entry its size.
func (p *Provider) WriteFile(ctx context.Context, id, dst string, r io.Reader, mode fs.FileMode) error {
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return fmt.Errorf("%w: path %q must be an absolute path below /, e.g. /tmp/data.txt", roche.ErrInvalidConfig, dst)
	}
	dir, err := os.MkdirTemp("", "roche-write-")
	if err != nil {
		return fmt.Errorf("staging the file for sandbox %s: %w", id, err)
	}
	defer os.RemoveAll(dir)
	local := filepath.Join(dir, path.Base(dst))
	f, err := os.OpenFile(local, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode.Perm())
	if err != nil {
		return fmt.Errorf("staging the file for sandbox %s: %w", id, err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("reading the content for %s: %w", dst, err)
	}
	// The file's mode, not the umask's leftover, is what the sandbox gets.
	if err := os.Chmod(local, mode.Perm()); err != nil {
		return err
	}
	return p.CopyTo(ctx, id, local, dst)
}

// ReadFile streams the sandbox file at src to w, as roche.FileSystem's ReadFile does
// in-process. A directory is refused: CopyFrom copies those.
func (p *Provider) ReadFile(ctx context.Context, id, src string, w io.Writer) error {
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return fmt.Errorf("%w: path %q must be an absolute path below /, e.g. /tmp/data.txt", roche.ErrInvalidConfig, src)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := p.c.rpc.CopyFrom(ctx, connect.NewRequest(&rochev1.CopyFromRequest{SandboxId: id, Src: src}))
	if err != nil {
		return p.c.fromRPC(err)
	}
	defer stream.Close()
	pr, pw := io.Pipe()
	read := make(chan error, 1)
	go func() {
		err := singleFile(pr, src, w)
		if err != nil {
			cancel() // the rest of the download is of no use
		}
		_, _ = io.Copy(io.Discard, pr)
		read <- err
	}()
	for stream.Receive() {
		if _, err := pw.Write(stream.Msg().TarChunk); err != nil {
			break
		}
	}
	serr := stream.Err()
	pw.Close()
	rerr := <-read
	// The daemon's own error (not found, ...) explains an empty or cut-off archive; a
	// cancellation is ours when the file could not be read.
	if serr != nil && connect.CodeOf(serr) != connect.CodeCanceled {
		return p.c.fromRPC(serr)
	}
	if rerr != nil {
		return rerr
	}
	return p.c.fromRPC(serr)
}

// singleFile copies the content of the tar stream's first entry, which must be a
// regular file, to w.
func singleFile(r io.Reader, src string, w io.Writer) error {
	tr := tar.NewReader(r)
	hdr, err := tr.Next()
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("reading %s: the daemon sent an empty archive", src)
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	switch hdr.Typeflag {
	case tar.TypeReg:
	case tar.TypeDir:
		return fmt.Errorf("%w: %s is a directory: ReadFile reads files; CopyFrom copies directories", roche.ErrInvalidConfig, src)
	default:
		return fmt.Errorf("%w: %s is not a regular file", roche.ErrInvalidConfig, src)
	}
	if _, err := io.Copy(w, tr); err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	return nil
}
