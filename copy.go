package roche

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

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

// copier is a TarCopier that enforces a copy's options on its own side too (kit.Copier:
// roched's client); CopyIn and CopyOut defer to it.
type copier interface {
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

// CopyIn copies the host file or directory src into sandbox id, where it becomes the
// absolute path dst. src's own path is taken as given; below it nothing is followed: a
// symlink is copied as a symlink, and every file is read through a descriptor opened
// without following links, so code swapping files for links in a shared directory
// cannot make the copy read anything outside src.
func CopyIn(ctx context.Context, tc TarCopier, id, src, dst string, opts CopyOptions) (CopyReport, error) {
	if c, ok := tc.(copier); ok {
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
	err := tarfs.PipeTo(ctx, tc, id, dst, func(w io.Writer) error {
		rep, werr = tarfs.Write(w, src, path.Base(dst), tarfs.Options{MaxBytes: opts.Limit()})
		return werr
	})
	report := reportFrom(rep, func(name string) string {
		_, below, _ := strings.Cut(name, "/")
		return filepath.Join(src, below)
	})
	if err != nil && werr != nil && errors.Is(err, werr) {
		return report, hostErrs.Wrap(fmt.Sprintf("copying %s into sandbox %s", src, id), err)
	}
	return report, err
}

// CopyOut copies the sandbox path src out of sandbox id to the host path dst. dst's
// parent directories are taken as given (and made when missing); at and below dst no
// symlink is ever followed, whatever was there before: a link where a directory or file
// is to go is replaced. Symlinks are recreated only with opts.PreserveLinks, and only
// those pointing inside dst. Runs of zeros become holes, so sparse files stay sparse.
func CopyOut(ctx context.Context, tc TarCopier, id, src, dst string, opts CopyOptions) (CopyReport, error) {
	if c, ok := tc.(copier); ok {
		return c.CopyOut(ctx, id, src, dst, opts)
	}
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return CopyReport{}, fmt.Errorf("%w: source %q must be an absolute path below /", ErrInvalidConfig, src)
	}
	src = path.Clean(src)
	var rep tarfs.Report
	var xerr error
	err := tarfs.PipeFrom(ctx, tc, id, src, func(r io.Reader) error {
		rep, xerr = tarfs.Extract(r, dst, tarfs.Options{MaxBytes: opts.Limit(), Links: opts.links()})
		return xerr
	})
	report := reportFrom(rep, func(name string) string { return path.Join(path.Dir(src), name) })
	if err != nil && xerr != nil && errors.Is(err, xerr) {
		var le *tarfs.LimitError
		if errors.As(err, &le) {
			le.Name = path.Join(path.Dir(src), le.Name)
		}
		return report, hostErrs.Wrap(fmt.Sprintf("copying %s out of sandbox %s to %s", src, id, dst), err)
	}
	return report, err
}

// hostErrs are what the host's side of a copy fails with.
var hostErrs = tarfs.Sentinels{Exhausted: ErrExhausted, Permission: ErrPermission, Invalid: ErrInvalidConfig, NotFound: ErrNotFound}

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
