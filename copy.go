package roche

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/roche-sandbox/roche/internal/tarfs"
)

// DefaultCopyMaxBytes is the most file content one copy or read moves when the caller
// sets no cap: a sandbox holding a 10 TiB sparse file must not fill the host's disk or
// memory.
const DefaultCopyMaxBytes int64 = 1 << 30

// TarCopier moves files between a caller and a sandbox as tar streams, the form every
// backend's copy already takes (roche-agent, Docker's archive API, tar in the sandbox).
// roched relays these streams without staging them on its host; CopyIn and CopyOut put
// the host's side around them. Every provider that copies files implements it.
type TarCopier interface {
	// CopyTarTo unpacks the tar stream r in the sandbox, with the sandbox user's rights:
	// its single root entry becomes the absolute path dst, parents created.
	CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error
	// CopyTarFrom writes the sandbox path src to w as a tar stream whose root entry is
	// named path.Base(src). The stream is the sandbox's to shape, so it is untrusted:
	// unpack it with CopyOut (or tarfs), never with a tar that follows what it finds.
	CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error
}

// Copier is a TarCopier that has more to do with a copy's options than CopyIn and
// CopyOut do with its streams: roched's client sends them to the daemon, which enforces
// them on its side too. CopyIn and CopyOut defer to it.
type Copier interface {
	CopyIn(ctx context.Context, id, src, dst string, opts CopyOptions) (CopyReport, error)
	CopyOut(ctx context.Context, id, src, dst string, opts CopyOptions) (CopyReport, error)
}

// CopyOptions bound a copy between the host and a sandbox.
type CopyOptions struct {
	// MaxBytes caps the file content one copy moves; 0 means DefaultCopyMaxBytes. The
	// file that would pass it is refused, with ErrExhausted, before any of it is written.
	MaxBytes int64
	// PreserveLinks, copying out, recreates the sandbox's symlinks on the host, but only
	// those whose target is relative and stays inside the destination. Without it every
	// symlink is left out. Either way what is left out is counted in the CopyReport.
	// Copying in, symlinks are always kept: in the sandbox they reach nothing its user
	// could not.
	PreserveLinks bool
}

// Limit is the cap the options set.
func (o CopyOptions) Limit() int64 {
	if o.MaxBytes > 0 {
		return o.MaxBytes
	}
	return DefaultCopyMaxBytes
}

// CopyReport says what a copy moved and what it left out.
type CopyReport struct {
	Files int   `json:"files"`
	Dirs  int   `json:"dirs"`
	Links int   `json:"links"`
	Bytes int64 `json:"bytes"`
	// Skipped counts the entries left out; SkippedLinks those of them that were symlinks.
	Skipped      int `json:"skipped"`
	SkippedLinks int `json:"skipped_links"`
	// Examples are the first few entries left out.
	Examples []SkippedEntry `json:"skipped_examples,omitempty"`
}

// SkippedEntry is an entry a copy left out.
type SkippedEntry struct {
	Path   string `json:"path"`             // where it was in the source
	Target string `json:"target,omitempty"` // a symlink's target
	// Reason: "symlink" (links were not asked for), "outside" (a link pointing outside
	// the destination) or "special" (a device, fifo, socket or hard link).
	Reason string `json:"reason"`
}

// Note is a one-line account of what the copy left out, or "" when it left out nothing.
func (r CopyReport) Note() string {
	if r.Skipped == 0 {
		return ""
	}
	var shown []string
	for _, e := range r.Examples {
		if e.Target != "" {
			shown = append(shown, e.Path+" -> "+e.Target)
		} else {
			shown = append(shown, e.Path)
		}
	}
	list := strings.Join(shown, ", ")
	if r.Skipped > len(shown) {
		list += ", ..."
	}
	var why []string
	if r.SkippedLinks > 0 {
		why = append(why, "symlinks are copied out only when asked (--preserve-links) and only if they point inside the destination")
	}
	if r.Skipped > r.SkippedLinks {
		why = append(why, "devices, fifos, sockets and hard links are not copied")
	}
	what := plural(r.Skipped, "entry", "entries")
	switch r.SkippedLinks {
	case r.Skipped:
		what = plural(r.Skipped, "symlink", "symlinks")
	case 0:
		what = plural(r.Skipped, "special file", "special files")
	}
	return fmt.Sprintf("skipped %d %s (%s): %s", r.Skipped, what, list, strings.Join(why, "; "))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// errCopyEnded closes a pipe whose other end has finished, so its writer stops.
var errCopyEnded = errors.New("the copy ended")

// PipeTo runs tc.CopyTarTo for dst in sandbox id on the tar stream produce writes, as it
// writes it. The error is produce's when produce failed (the sandbox's side then saw
// the stream cut off), else the sandbox side's.
func PipeTo(ctx context.Context, tc TarCopier, id, dst string, produce func(io.Writer) error) error {
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
func PipeFrom(ctx context.Context, tc TarCopier, id, src string, consume func(io.Reader) error) error {
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
	shortStream := errors.Is(cerr, tarfs.ErrEmpty) || errors.Is(cerr, io.ErrUnexpectedEOF) || errors.Is(cerr, tar.ErrHeader)
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

// CopyIn copies the host file or directory src into sandbox id, where it becomes the
// absolute path dst. src's own path is taken as given; below it nothing is followed: a
// symlink is copied as a symlink, and every file is read through a descriptor opened
// without following links, so code swapping files for links in a shared directory
// cannot make the copy read anything outside src.
func CopyIn(ctx context.Context, tc TarCopier, id, src, dst string, opts CopyOptions) (CopyReport, error) {
	if c, ok := tc.(Copier); ok {
		return c.CopyIn(ctx, id, src, dst, opts)
	}
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return CopyReport{}, fmt.Errorf("%w: destination %q must be an absolute path below /", ErrInvalidConfig, dst)
	}
	dst = path.Clean(dst)
	if _, err := os.Lstat(src); err != nil {
		return CopyReport{}, fmt.Errorf("%w: host path %s: %v", ErrNotFound, src, err)
	}
	var rep tarfs.Report
	var werr error
	err := PipeTo(ctx, tc, id, dst, func(w io.Writer) error {
		rep, werr = tarfs.Write(w, src, path.Base(dst), tarfs.Options{MaxBytes: opts.Limit()})
		return werr
	})
	report := reportFrom(rep, func(name string) string {
		_, below, _ := strings.Cut(name, "/")
		return filepath.Join(src, below)
	})
	if err != nil && werr != nil && errors.Is(err, werr) {
		return report, CopyErr(fmt.Sprintf("copying %s into sandbox %s", src, id), err)
	}
	return report, err
}

// CopyOut copies the sandbox path src out of sandbox id to the host path dst. dst's
// parent directories are taken as given (and made when missing); at and below dst no
// symlink is ever followed, whatever was there before: a link where a directory or file
// is to go is replaced. Symlinks are recreated only with opts.PreserveLinks, and only
// those pointing inside dst. Runs of zeros become holes, so sparse files stay sparse.
func CopyOut(ctx context.Context, tc TarCopier, id, src, dst string, opts CopyOptions) (CopyReport, error) {
	if c, ok := tc.(Copier); ok {
		return c.CopyOut(ctx, id, src, dst, opts)
	}
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return CopyReport{}, fmt.Errorf("%w: source %q must be an absolute path below /", ErrInvalidConfig, src)
	}
	src = path.Clean(src)
	var rep tarfs.Report
	var xerr error
	err := PipeFrom(ctx, tc, id, src, func(r io.Reader) error {
		rep, xerr = tarfs.Extract(r, dst, tarfs.Options{MaxBytes: opts.Limit(), Links: opts.links()})
		return xerr
	})
	report := reportFrom(rep, func(name string) string { return path.Join(path.Dir(src), name) })
	if err != nil && xerr != nil && errors.Is(err, xerr) {
		var le *tarfs.LimitError
		if errors.As(err, &le) {
			le.Name = path.Join(path.Dir(src), le.Name)
		}
		return report, CopyErr(fmt.Sprintf("copying %s out of sandbox %s to %s", src, id, dst), err)
	}
	return report, err
}

func (o CopyOptions) links() tarfs.LinkPolicy {
	if o.PreserveLinks {
		return tarfs.InsideLinks
	}
	return tarfs.SkipLinks
}

// reportFrom converts a tarfs report; where turns an archive name into a source path.
func reportFrom(r tarfs.Report, where func(string) string) CopyReport {
	out := CopyReport{Files: r.Files, Dirs: r.Dirs, Links: r.Links, Bytes: r.Bytes, Skipped: r.Skipped, SkippedLinks: r.SkippedLinks}
	for _, e := range r.Examples {
		out.Examples = append(out.Examples, SkippedEntry{Path: where(e.Name), Target: e.Linkname, Reason: e.Reason})
	}
	return out
}

// CopyErr gives an error of the host's side of a copy (reading or writing its files,
// checking its archive) its sentinel, with what as context.
func CopyErr(what string, err error) error {
	switch {
	case errors.Is(err, tarfs.ErrLimit):
		return fmt.Errorf("%w: %s: %v: copy less, or raise the cap (roche cp --max-bytes, max_bytes= in the SDK)", ErrExhausted, what, err)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %s: no space left on the host: %v", ErrExhausted, what, err)
	case errors.Is(err, tarfs.ErrUnsafe):
		return fmt.Errorf("%w: %s: %v", ErrPermission, what, err)
	case errors.Is(err, tarfs.ErrNotDir), errors.Is(err, tarfs.ErrIsDir):
		return fmt.Errorf("%w: %s: %v: remove it or copy to another path", ErrInvalidConfig, what, err)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s: %v", ErrNotFound, what, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w: %s: %v", ErrPermission, what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// ParseSize parses a byte count as --max-bytes takes it: "1g", "512m", "1.5GiB",
// "65536k" or a plain number. Units are binary and case-insensitive.
func ParseSize(s string) (int64, error) {
	orig := s
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "ib"), "b")
	mult := 1.0
	if n := len(s); n > 0 {
		if i := strings.IndexByte("kmgtp", s[n-1]); i >= 0 {
			mult = math.Pow(1024, float64(i+1))
			s = s[:n-1]
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v*mult < 1 {
		return 0, fmt.Errorf("%w: %q is not a size: give a positive number with an optional unit k, m, g or t, e.g. 2g", ErrInvalidConfig, orig)
	}
	if v*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("%w: %q is too large", ErrInvalidConfig, orig)
	}
	return int64(v * mult), nil
}
