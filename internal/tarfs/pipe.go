package tarfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"syscall"
)

// Copier is the sandbox's side of a copy: roche.TarCopier, which every provider that
// copies files implements.
type Copier interface {
	CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error
	CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error
}

// errCopyEnded closes a pipe whose other end has finished, so its writer stops.
var errCopyEnded = errors.New("the copy ended")

// PipeTo runs tc.CopyTarTo for dst in sandbox id on the tar stream produce writes, as it
// writes it. The error is produce's when produce failed (the sandbox's side then saw
// the stream cut off), else the sandbox side's.
func PipeTo(ctx context.Context, tc Copier, id, dst string, produce func(io.Writer) error) error {
	pr, pw := io.Pipe()
	var werr error
	written := make(chan struct{})
	go func() {
		defer close(written)
		werr = produce(pw)
		pw.CloseWithError(werr)
	}()
	err := tc.CopyTarTo(ctx, id, dst, pr)
	pr.CloseWithError(errCopyEnded)
	<-written
	if werr != nil && !errors.Is(werr, errCopyEnded) {
		return werr
	}
	return err
}

// PipeFrom runs tc.CopyTarFrom for src in sandbox id and hands the stream to consume
// as it comes; when consume refuses the stream (a cap, an unsafe entry), the sandbox's
// side is stopped. The error is the sandbox side's when it failed and consume saw only
// the consequence (an empty or cut-off archive), else consume's.
func PipeFrom(ctx context.Context, tc Copier, id, src string, consume func(io.Reader) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	produced := make(chan error, 1)
	go func() {
		err := tc.CopyTarFrom(ctx, id, src, pw)
		pw.CloseWithError(err)
		produced <- err
	}()
	cerr := consume(pr)
	shortStream := errors.Is(cerr, ErrEmpty) || errors.Is(cerr, io.ErrUnexpectedEOF) || errors.Is(cerr, tar.ErrHeader)
	if cerr == nil || shortStream {
		// Let the sandbox's side finish (a tar pads its end; a failing tar reports only
		// after its partial archive), but not forever.
		_, _ = io.CopyN(io.Discard, pr, 1<<20)
	} else {
		cancel()
	}
	pr.CloseWithError(errCopyEnded)
	perr := <-produced
	failed := perr != nil && !errors.Is(perr, errCopyEnded) && !(cerr != nil && errors.Is(perr, context.Canceled))
	switch {
	case cerr != nil && failed && (shortStream || errors.Is(cerr, perr)):
		return perr
	case cerr != nil:
		return cerr
	case failed:
		return perr
	}
	return nil
}

// Sentinels are the errors a caller reports the host's side of a copy as: roche's
// (ErrExhausted, ErrPermission, ErrInvalidConfig, ErrNotFound), given by roche.CopyIn
// and CopyOut and by roched, since this package is below roche and cannot name them.
type Sentinels struct {
	Exhausted, Permission, Invalid, NotFound error
}

// Wrap gives err, of the host's side of a copy (reading or writing its files, checking
// its archive), its sentinel, with what as context.
func (s Sentinels) Wrap(what string, err error) error {
	switch {
	case errors.Is(err, ErrLimit):
		return fmt.Errorf("%w: %s: %v: copy less, or raise the cap (roche cp --max-bytes, max_bytes= in the SDK)", s.Exhausted, what, err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %s: no space left on the host: %v", s.Exhausted, what, err)
	case errors.Is(err, ErrUnsafe):
		return fmt.Errorf("%w: %s: %v", s.Permission, what, err)
	case errors.Is(err, ErrNotDir), errors.Is(err, ErrIsDir):
		return fmt.Errorf("%w: %s: %v: remove it or copy to another path", s.Invalid, what, err)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s: %v", s.NotFound, what, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %s: %v", s.Permission, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
