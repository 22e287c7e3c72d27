// Package tarfs moves files between the host and a sandbox as tar streams, the format
// both the Docker archive API and roche-agent speak, and unpacks root filesystems (an
// image's, a container's export: ExtractTree): Roche's one tar extraction path.
//
// Both ends treat the other as hostile. Write reads its source without following any
// symlink below the path it was given: every file and directory is opened relative to
// its parent's descriptor with O_NOFOLLOW and described by fstat of what was opened, so
// code racing to swap a file for a symlink (in a read-write mount, say) cannot make it
// read anything outside the source. Extract and ExtractTree write their destination the
// same way: they never follow a symlink at or below the destination (one already there
// is replaced, not written through; an entry below one the archive made is refused),
// refuse entries that climb out with "..", cap the bytes they write before writing them,
// and keep runs of zeros as holes so a sparse file stays sparse. Extract also refuses
// absolute names and creates symlinks only when asked and, for a host, only those
// pointing inside the destination.
package tarfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/roche-sandbox/roche/internal/size"
)

var (
	// ErrLimit: the copy would move more than Options.MaxBytes; see LimitError.
	ErrLimit = errors.New("over the copy's size limit")
	// ErrUnsafe: an archive entry would land outside the destination (an absolute name,
	// a ".." component, a second root), or a path to read goes through a symlink.
	ErrUnsafe = errors.New("unsafe path")
	// ErrLinkRefused: the archive holds a symlink and Options.Links is RefuseLinks.
	ErrLinkRefused = errors.New("symbolic links are not accepted here")
	// ErrNotDir: the archive has a directory where the destination holds something else.
	ErrNotDir = errors.New("not a directory")
	// ErrIsDir: the archive has a file or link where the destination holds a directory.
	ErrIsDir = errors.New("is a directory")
	// ErrEmpty: the archive held no entry at all.
	ErrEmpty = errors.New("the archive was empty")
	// ErrMalformed: the stream is not a tar archive, or one cut short.
	ErrMalformed = errors.New("not a whole tar archive")
)

// LinkPolicy says what Extract and Filter do with a symlink entry.
type LinkPolicy int

const (
	// SkipLinks leaves symlinks out and counts them in Report.Skipped: the default for
	// anything written on a host.
	SkipLinks LinkPolicy = iota
	// InsideLinks creates a symlink only when its target is relative and, resolved from
	// where it stands, stays inside the destination; the others are skipped.
	InsideLinks
	// AllLinks creates symlinks as they are. Only for extraction inside a sandbox, as the
	// sandbox user, where a link can reach nothing that user could not.
	AllLinks
	// RefuseLinks fails on the first symlink (a wasm sandbox holds none).
	RefuseLinks
)

// TreeOptions say what ExtractTree makes besides files, directories and links.
type TreeOptions struct {
	// Devices makes device nodes and fifos (a microVM's root filesystem, which its own
	// kernel mounts); without it they are skipped (a container gets its /dev from the
	// runtime).
	Devices bool
	// Xattrs keeps regular files' extended attributes (PAX SCHILY.xattr records), file
	// capabilities among them.
	Xattrs bool
}

// Options bound a Write, Extract or Filter.
type Options struct {
	// MaxBytes caps the total size of the regular files moved; 0 means no cap. The entry
	// that would pass it is refused before any of its content is written.
	MaxBytes int64
	// Links is what becomes of symlinks (Extract and Filter; Write always sends them).
	Links LinkPolicy
}

// Skip reasons, in Skipped.Reason (the same words as roche.SkippedEntry's).
const (
	ReasonLink    = "symlink" // a symlink, and links were not asked for
	ReasonOutside = "outside" // a symlink pointing outside the destination
	ReasonSpecial = "special" // not a regular file, directory or symlink
)

// Skipped is an entry left out.
type Skipped struct {
	Name     string // the entry's name in the archive
	Linkname string // a symlink's target
	Reason   string // one of the Reason constants
}

// maxExamples bounds Report.Examples: a tree of a million links is reported by count.
const maxExamples = 5

// Report says what a Write, Extract, ExtractTree or Filter moved and what it left out.
type Report struct {
	Files, Dirs, Links int
	Bytes              int64 // content of the regular files
	// HardLinks and Nodes (devices and fifos) are made by ExtractTree only.
	HardLinks, Nodes int
	Skipped          int
	SkippedLinks     int       // the skipped entries that were symlinks
	Examples         []Skipped // the first few skipped entries
}

func (r *Report) skip(name, link, reason string) {
	r.Skipped++
	if reason != ReasonSpecial {
		r.SkippedLinks++
	}
	if len(r.Examples) < maxExamples {
		r.Examples = append(r.Examples, Skipped{Name: name, Linkname: link, Reason: reason})
	}
}

// LimitError is a copy refused for its size.
type LimitError struct {
	Name  string // the entry that would pass the limit
	Size  int64  // its size
	Limit int64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s is %s, which takes the copy past its limit of %s", e.Name, size.String(e.Size), size.String(e.Limit))
}

func (e *LimitError) Unwrap() error { return ErrLimit }

// checker validates archive entries as they come, for Extract, ExtractTree and Filter.
type checker struct {
	opts Options
	// tree, for ExtractTree, says the archive is a root filesystem: entries are named
	// below the destination itself rather than below one root entry.
	tree *TreeOptions
	root string // the first entry's root component
	rep  Report
}

// check returns the components of hdr's name below the archive's root (nil for the root
// itself), or skip when the entry is left out. An error ends the copy.
func (c *checker) check(hdr *tar.Header) (rest []string, skip bool, err error) {
	if c.tree != nil {
		return c.checkTree(hdr)
	}
	name := strings.TrimPrefix(hdr.Name, "./")
	if path.IsAbs(name) {
		return nil, false, fmt.Errorf("%w: archive entry %q has an absolute name", ErrUnsafe, hdr.Name)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return nil, false, fmt.Errorf("%w: archive entry %q climbs out with \"..\"", ErrUnsafe, hdr.Name)
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return nil, false, fmt.Errorf("%w: archive entry %q has no name", ErrUnsafe, hdr.Name)
	}
	if c.root == "" {
		c.root = parts[0]
	} else if parts[0] != c.root {
		return nil, false, fmt.Errorf("%w: archive entry %q is outside its root %q", ErrUnsafe, hdr.Name, c.root)
	}
	rest = parts[1:]
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse:
		if c.opts.MaxBytes > 0 && hdr.Size > c.opts.MaxBytes-c.rep.Bytes {
			return nil, false, &LimitError{Name: hdr.Name, Size: hdr.Size, Limit: c.opts.MaxBytes}
		}
	case tar.TypeDir:
	case tar.TypeSymlink:
		switch c.opts.Links {
		case SkipLinks:
			c.rep.skip(hdr.Name, hdr.Linkname, ReasonLink)
			return nil, true, nil
		case InsideLinks:
			if !linkInside(rest, hdr.Linkname) {
				c.rep.skip(hdr.Name, hdr.Linkname, ReasonOutside)
				return nil, true, nil
			}
		case RefuseLinks:
			return nil, false, fmt.Errorf("%w: %s is a symbolic link (to %s)", ErrLinkRefused, hdr.Name, hdr.Linkname)
		}
	default:
		// Hard links, devices and fifos are never recreated from an archive.
		c.rep.skip(hdr.Name, hdr.Linkname, ReasonSpecial)
		return nil, true, nil
	}
	return rest, false, nil
}

// checkTree is check for a root filesystem (ExtractTree): every name lands below the
// destination, an absolute one as if relative, and none may climb out; hard links name a
// file of the tree; devices and fifos are kept only when asked.
func (c *checker) checkTree(hdr *tar.Header) (rest []string, skip bool, err error) {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil, true, nil // a PAX header for the entries after it, no file
	}
	rest, err = treeName(hdr.Name)
	if err != nil {
		return nil, false, err
	}
	if len(rest) == 0 {
		if hdr.Typeflag != tar.TypeDir {
			return nil, false, fmt.Errorf("%w: archive entry %q names the root itself, and is no directory", ErrUnsafe, hdr.Name)
		}
		// The root is the caller's directory, with the mode the caller gave it: a
		// layer's root entry tells how its builder's directory was (roche/python:local's
		// is 0700), which Docker ignores too.
		return nil, true, nil
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse:
		if c.opts.MaxBytes > 0 && hdr.Size > c.opts.MaxBytes-c.rep.Bytes {
			return nil, false, &LimitError{Name: hdr.Name, Size: hdr.Size, Limit: c.opts.MaxBytes}
		}
	case tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if !c.tree.Devices {
			c.rep.skip(hdr.Name, "", ReasonSpecial)
			return nil, true, nil
		}
	default:
		c.rep.skip(hdr.Name, hdr.Linkname, ReasonSpecial)
		return nil, true, nil
	}
	return rest, false, nil
}

// treeName splits an entry name of a root filesystem into its components below the
// root (none for the root itself): "./usr/bin", "usr/bin/" and "/usr/bin" are all
// usr, bin. A ".." anywhere, or a NUL, is refused.
func treeName(name string) ([]string, error) {
	if strings.Contains(name, "\x00") {
		return nil, fmt.Errorf("%w: archive entry %q has a NUL byte", ErrUnsafe, name)
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return nil, fmt.Errorf("%w: archive entry %q climbs out with \"..\"", ErrUnsafe, name)
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// counted records an entry once it has been written.
func (c *checker) counted(hdr *tar.Header) {
	switch hdr.Typeflag {
	case tar.TypeDir:
		c.rep.Dirs++
	case tar.TypeSymlink:
		c.rep.Links++
	case tar.TypeLink:
		c.rep.HardLinks++
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		c.rep.Nodes++
	default:
		c.rep.Files++
		c.rep.Bytes += hdr.Size
	}
}

// linkInside reports whether a symlink whose path below the destination's root is rest
// and whose target is link resolves inside the destination. The target must be
// relative, its ".." components must all come first (after a name, ".." would apply to
// whatever that name resolves to, which may be the root itself), and there may be no
// more of them than directories between the link and the root. Every link created under
// this rule points inside, so following a chain of them stays inside too. A root that
// is itself a symlink is never inside: the destination is the link.
func linkInside(rest []string, link string) bool {
	if len(rest) == 0 || link == "" || path.IsAbs(link) {
		return false
	}
	ups, named := 0, false
	for _, p := range strings.Split(link, "/") {
		switch p {
		case "", ".":
		case "..":
			if named {
				return false
			}
			ups++
		default:
			named = true
		}
	}
	return ups <= len(rest)-1
}

// Filter copies the tar stream r to w, entry by entry, applying the same checks as
// Extract: names are made relative and must share one root (renamed to root when root
// is not empty), symlinks follow opts.Links, other special files are dropped, and
// opts.MaxBytes is enforced before the content that would pass it is sent. The output
// holds only what passed, so a relay (roched) can hand it on without trusting either end.
func Filter(r io.Reader, w io.Writer, root string, opts Options) (Report, error) {
	c := &checker{opts: opts}
	tr := tar.NewReader(r)
	tw := tar.NewWriter(w)
	seen := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return c.rep, fmt.Errorf("reading archive: %w", malformed(err))
		}
		seen = true
		rest, skip, err := c.check(hdr)
		if err != nil {
			return c.rep, err
		}
		if skip {
			continue
		}
		name := c.root
		if root != "" {
			name = root
		}
		out := &tar.Header{
			Name:     path.Join(append([]string{name}, rest...)...),
			Mode:     hdr.Mode & 0o777,
			ModTime:  hdr.ModTime,
			Typeflag: hdr.Typeflag,
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			out.Name += "/"
		case tar.TypeSymlink:
			out.Linkname = hdr.Linkname
		default:
			out.Typeflag, out.Size = tar.TypeReg, hdr.Size
		}
		if err := tw.WriteHeader(out); err != nil {
			return c.rep, err
		}
		if out.Typeflag == tar.TypeReg {
			if _, err := io.CopyN(tw, tr, hdr.Size); err != nil {
				return c.rep, fmt.Errorf("copying %s: %w", hdr.Name, malformed(err))
			}
		}
		c.counted(hdr)
	}
	if !seen {
		return c.rep, ErrEmpty
	}
	return c.rep, tw.Close()
}

// malformed marks what archive/tar reports of a stream that is not a tar archive, or
// that ends mid-entry, as ErrMalformed; an error of the reader beneath (a connection's)
// stays as it is.
func malformed(err error) error {
	if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrFieldTooLong) {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return err
}
